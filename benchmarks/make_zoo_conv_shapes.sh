#!/usr/bin/env bash
# The zoo convolutions the H200 cuDNN workspace table answers from neighbours, for
# `cudnn_probe.py --shapes` (docs/MEASURE.md "Next lease (prepared 2026-11-27)"): ResNet-50 at
# batch 64-256 in every precision (and with --grad-checkpointing), bf16 MobileNetV2 /
# EfficientNet-B0 at batch 16-256, ResNet-18 fp32 / bf16 at 64-256, bf16 MobileNetV3-Large at
# 32-128. About 10-60 s per job on the CPU.
#   PYTHONPATH=src bash benchmarks/make_zoo_conv_shapes.sh [OUT.csv]
set -u
OUT=${1:-benchmarks/data/zoo_conv_shapes.csv}
rm -f "$OUT"
C="python benchmarks/conv_table_coverage.py --out $OUT --"
for b in 64 128 256; do for p in fp32 bf16 fp16; do
  timeout 300 $C python benchmarks/zoo/vision.py --model resnet50 --precision $p --batch-size $b | tail -1
done; done
for b in 64 128 256; do
  timeout 300 $C python benchmarks/zoo/vision.py --model resnet50 --precision fp32 --batch-size $b --grad-checkpointing | tail -1
done
for m in mobilenet_v2 efficientnet_b0; do for b in 16 32 64 128 256; do
  timeout 300 $C python benchmarks/zoo/vision.py --model $m --precision bf16 --batch-size $b | tail -1
done; done
for b in 64 128 256; do for p in fp32 bf16; do  # the 7x7 stem beyond batch 32 (docs/cnn.md)
  timeout 300 $C python benchmarks/zoo/vision.py --model resnet18 --precision $p --batch-size $b | tail -1
done; done
for b in 32 64 128; do
  timeout 300 $C python benchmarks/zoo/vision.py --model mobilenet_v3_large --precision bf16 --batch-size $b | tail -1
done
