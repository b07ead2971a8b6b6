"""pytorch/tutorials intermediate_source/pipelining_tutorial.rst, re-created: run as `torchrun
--nnodes 1 --nproc_per_node 2 pipelining_tutorial.py`. A GPT-style Transformer (embedding, a
ModuleDict of nn.TransformerDecoderLayer, LayerNorm, output Linear) split by hand into two
stages (stage 0 deletes the second half of the layers, the norm and the output; stage 1 the
first half and the embedding), `PipelineStage(model, stage_index, num_stages, device)`, a
schedule over 4 microbatches with a token-wise cross-entropy loss; rank 0 steps with the input,
rank 1 with the target. Tiny config (dim 64, 4 layers, 4 heads, vocab 512, batch 8 x 32).
Options beyond the tutorial: `--schedule 1f1b` (Schedule1F1B, the other single-stage schedule it
names), `--split tracer` (its tracer-based split) and `--train-steps N` (an SGD step after each
schedule step, as torchtitan's loop does; the tutorial runs one schedule step and no optimizer)."""

import argparse
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    SplitPoint,
    pipeline,
)


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    vocab_size: int = 512


class Transformer(nn.Module):
    def __init__(self, model_args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(model_args.vocab_size, model_args.dim)
        # Using a ModuleDict lets us delete layers witout affecting names,
        # ensuring checkpoints will correctly save and load.
        self.layers = torch.nn.ModuleDict()
        for layer_id in range(model_args.n_layers):
            self.layers[str(layer_id)] = nn.TransformerDecoderLayer(model_args.dim, model_args.n_heads)
        self.norm = nn.LayerNorm(model_args.dim)
        self.output = nn.Linear(model_args.dim, model_args.vocab_size)

    def forward(self, tokens: torch.Tensor):
        # Handling layers being 'None' at runtime enables easy pipeline splitting
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, h)
        h = self.norm(h) if self.norm else h
        output = self.output(h).clone() if self.output else h
        return output


def init_distributed():
    global rank, device, pp_group, stage_index, num_stages
    rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device = torch.device(f"cuda:{rank}") if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group()
    # This group can be a sub-group in the N-D parallel case
    pp_group = dist.new_group()
    stage_index = rank
    num_stages = world_size


def manual_model_split(model) -> PipelineStage:
    half = len(model.layers) // 2
    if stage_index == 0:
        # prepare the first stage model
        for i in range(half, 2 * half):
            del model.layers[str(i)]
        model.norm = None
        model.output = None
    elif stage_index == 1:
        # prepare the second stage model
        for i in range(half):
            del model.layers[str(i)]
        model.tok_embeddings = None
    return PipelineStage(model, stage_index, num_stages, device)


def tracer_model_split(model, example_input_microbatch) -> PipelineStage:
    pipe = pipeline(module=model, mb_args=(example_input_microbatch,),
                    split_spec={"layers.2": SplitPoint.BEGINNING})
    return pipe.build_stage(stage_index, device, pp_group)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    parser.add_argument("--split", choices=("manual", "tracer"), default="manual")
    parser.add_argument("--train-steps", type=int, default=0)
    args = parser.parse_args()

    init_distributed()
    num_microbatches = 4
    model_args = ModelArgs()
    model = Transformer(model_args)

    # Dummy data
    x = torch.ones(8, 32, dtype=torch.long)
    y = torch.randint(0, model_args.vocab_size, (8, 32), dtype=torch.long)
    example_input_microbatch = x.chunk(num_microbatches)[0]

    if args.split == "manual":
        stage = manual_model_split(model)
    else:
        stage = tracer_model_split(model, example_input_microbatch)

    model.to(device)
    x = x.to(device)
    y = y.to(device)

    def tokenwise_loss_fn(outputs, targets):
        loss_fn = nn.CrossEntropyLoss()
        outputs = outputs.reshape(-1, model_args.vocab_size)
        targets = targets.reshape(-1)
        return loss_fn(outputs, targets)

    schedule_class = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = schedule_class(stage, n_microbatches=num_microbatches, loss_fn=tokenwise_loss_fn)
    optimizer = (torch.optim.SGD(stage.submod.parameters(), lr=0.01, momentum=0.9)
                 if args.train_steps else None)

    for _ in range(max(1, args.train_steps)):
        if rank == 0:
            schedule.step(x)
        elif rank == 1:
            losses = []
            output = schedule.step(target=y, losses=losses)
            print(f"losses: {losses}")
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
    dist.destroy_process_group()
