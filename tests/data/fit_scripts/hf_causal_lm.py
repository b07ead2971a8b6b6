"""A small transformers causal-LM fine-tuning loop whose memory is dominated by its logits."""

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=2)
parser.add_argument("--seq-len", type=int, default=2048)
args = parser.parse_args()

config = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                     max_position_embeddings=8192)
model = LlamaForCausalLM(config).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(2):
    ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len), device="cuda")
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
