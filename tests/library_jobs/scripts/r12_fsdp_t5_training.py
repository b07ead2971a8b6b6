"""pytorch/examples distributed/FSDP/T5_training.py (with its policies/ and utils/ helpers folded
in), re-created: run as `torchrun --nnodes 1 --nproc_per_node 2 T5_training.py`.
`T5ForConditionalGeneration.from_pretrained`, `DistributedSampler`s, FSDP1 with
`transformer_auto_wrap_policy` over T5Block, the bfSixteen MixedPrecision policy when bf16 is
ready (CUDA >= 11, `is_bf16_supported`, NCCL >= 2.10), `device_id=torch.cuda.current_device()`,
non-reentrant activation checkpointing of every T5Block (`apply_activation_checkpointing`),
AdamW + StepLR, a train and a validation loop each ending in an `all_reduce` of the loss sums,
rank-0 tqdm bars and memory tracking, and the best model saved on rank 0 through a
FULL_STATE_DICT (`offload_to_cpu=True, rank0_only=True`).
Local and tiny: the model directory is `--model_name_or_path`; the wikihow dataset becomes
random token ids of the same layout (source_ids, source_mask, target_ids; `--input-length`,
`--output-length`, `--train-samples`, `--val-samples`); no tokenizer.
With transformers 5 the example as written stops in its first backward (on a GPU as on the CPU):
T5's decoder fills its cross-attention cache in the forward and reads it back in the
checkpointed recomputation, so torch.utils.checkpoint sees fewer saved tensors
("CheckpointError: A different number of tensors was saved"). `--no-decoder-cache` passes
`use_cache=False` to the model's calls, the usual fix."""

import argparse
import functools
import os
import time
from datetime import datetime

import torch
import torch.distributed as dist
import torch.optim as optim
import tqdm
from packaging import version
from torch.cuda import nccl
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import FullStateDictConfig, MixedPrecision, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from transformers import T5ForConditionalGeneration
from transformers.models.t5.modeling_t5 import T5Block

g_gigabyte = 1024**3
CALL_OPTIONS = {}

bfSixteen = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                           buffer_dtype=torch.bfloat16)

non_reentrant_wrapper = functools.partial(checkpoint_wrapper, offload_to_cpu=False,
                                          checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def check_fn(submodule):
    return isinstance(submodule, T5Block)


def apply_fsdp_checkpointing(model):
    """apply activation checkpointing to model; returns None as model is updated directly"""
    print("--> applying fdsp activation checkpointing...")
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=non_reentrant_wrapper,
                                   check_fn=check_fn)


class wikihow(Dataset):  # noqa: N801 - the example's name
    """summarization_dataset.wikihow's items, from random ids instead of tokenized articles."""

    def __init__(self, vocab_size, type_path, num_samples, input_length, output_length):
        generator = torch.Generator().manual_seed(0 if type_path == "train" else 1)
        self.source = torch.randint(2, vocab_size, (num_samples, input_length), generator=generator)
        self.target = torch.randint(2, vocab_size, (num_samples, output_length), generator=generator)

    def __len__(self):
        return len(self.source)

    def __getitem__(self, index):
        return {"source_ids": self.source[index], "source_mask": torch.ones_like(self.source[index]),
                "target_ids": self.target[index], "target_mask": torch.ones_like(self.target[index])}


def setup():
    dist.init_process_group("nccl")


def cleanup():
    dist.destroy_process_group()


def get_date_of_run():
    date_of_run = datetime.now().strftime("%Y-%m-%d-%I:%M:%S_%p")
    print(f"--> current date and time of run = {date_of_run}")
    return date_of_run


def format_metrics_to_gb(item):
    return round(item / g_gigabyte, ndigits=4)


def train(args, model, rank, world_size, train_loader, optimizer, epoch, sampler=None):
    model.train()
    local_rank = int(os.environ['LOCAL_RANK'])
    fsdp_loss = torch.zeros(2).to(local_rank)
    if sampler:
        sampler.set_epoch(epoch)
    if rank == 0:
        inner_pbar = tqdm.tqdm(range(len(train_loader)), colour="blue", desc="r0 Training Epoch")
    for batch in train_loader:
        for key in batch:  # noqa: SIM118 - the example's loop
            batch[key] = batch[key].to(local_rank)
        optimizer.zero_grad()
        output = model(input_ids=batch["source_ids"], attention_mask=batch["source_mask"],
                       labels=batch["target_ids"], **CALL_OPTIONS)
        loss = output["loss"]
        loss.backward()
        optimizer.step()
        fsdp_loss[0] += loss.item()
        fsdp_loss[1] += len(batch)
        if rank == 0:
            inner_pbar.update(1)
    dist.all_reduce(fsdp_loss, op=dist.ReduceOp.SUM)
    train_accuracy = fsdp_loss[0] / fsdp_loss[1]
    if rank == 0:
        inner_pbar.close()
        print(f"Train Epoch: \t{epoch}, Loss: \t{train_accuracy:.4f}")
    return train_accuracy


def validation(model, rank, world_size, val_loader):
    model.eval()
    local_rank = int(os.environ['LOCAL_RANK'])
    fsdp_loss = torch.zeros(3).to(local_rank)
    if rank == 0:
        inner_pbar = tqdm.tqdm(range(len(val_loader)), colour="green", desc="Validation Epoch")
    with torch.no_grad():
        for batch in val_loader:
            for key in batch:  # noqa: SIM118 - the example's loop
                batch[key] = batch[key].to(local_rank)
            output = model(input_ids=batch["source_ids"], attention_mask=batch["source_mask"],
                           labels=batch["target_ids"], **CALL_OPTIONS)
            fsdp_loss[0] += output["loss"].item()
            fsdp_loss[1] += len(batch)
            if rank == 0:
                inner_pbar.update(1)
    dist.all_reduce(fsdp_loss, op=dist.ReduceOp.SUM)
    val_loss = fsdp_loss[0] / fsdp_loss[1]
    if rank == 0:
        inner_pbar.close()
        print(f"Validation Loss: {val_loss:.4f}")
    return val_loss


def fsdp_main(args):
    model = T5ForConditionalGeneration.from_pretrained(args.model_name_or_path)
    local_rank = int(os.environ['LOCAL_RANK'])
    rank = int(os.environ['RANK'])
    world_size = int(os.environ['WORLD_SIZE'])

    vocab = model.config.vocab_size
    train_dataset = wikihow(vocab, 'train', args.train_samples, args.input_length, args.output_length)
    val_dataset = wikihow(vocab, 'validation', args.val_samples, args.input_length, args.output_length)
    sampler1 = DistributedSampler(train_dataset, rank=rank, num_replicas=world_size, shuffle=True)
    sampler2 = DistributedSampler(val_dataset, rank=rank, num_replicas=world_size)

    setup()

    train_kwargs = {'batch_size': args.batch_size, 'sampler': sampler1}
    test_kwargs = {'batch_size': args.test_batch_size, 'sampler': sampler2}
    cuda_kwargs = {'num_workers': 2, 'pin_memory': True, 'shuffle': False}
    train_kwargs.update(cuda_kwargs)
    test_kwargs.update(cuda_kwargs)
    train_loader = torch.utils.data.DataLoader(train_dataset, **train_kwargs)
    val_loader = torch.utils.data.DataLoader(val_dataset, **test_kwargs)

    t5_auto_wrap_policy = functools.partial(transformer_auto_wrap_policy,
                                            transformer_layer_cls={T5Block})
    torch.cuda.set_device(local_rank)

    bf16_ready = (
        torch.version.cuda
        and torch.cuda.is_bf16_supported()
        and version.parse(torch.version.cuda).release >= (11, 0)
        and dist.is_nccl_available()
        and nccl.version() >= (2, 10)
    )
    mp_policy = bfSixteen if bf16_ready else None
    print(f"--> bf16_ready {bool(bf16_ready)}")

    model = FSDP(model, auto_wrap_policy=t5_auto_wrap_policy, mixed_precision=mp_policy,
                 device_id=torch.cuda.current_device())
    apply_fsdp_checkpointing(model)

    optimizer = optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    best_val_loss = float("inf")
    curr_val_loss = float("inf")
    file_save_name = "T5-model-"

    if rank == 0:
        time_of_run = get_date_of_run()
        dur = []
        train_acc_tracking = []
        val_acc_tracking = []
    if rank == 0 and args.track_memory:
        mem_alloc_tracker = []
        mem_reserved_tracker = []

    for epoch in range(1, args.epochs + 1):
        t0 = time.time()
        train_accuracy = train(args, model, rank, world_size, train_loader, optimizer, epoch,
                               sampler=sampler1)
        if args.run_validation:
            curr_val_loss = validation(model, rank, world_size, val_loader)
        scheduler.step()
        if rank == 0:
            print(f"--> epoch {epoch} completed...entering save and stats zone")
            dur.append(time.time() - t0)
            train_acc_tracking.append(train_accuracy.item())
            if args.run_validation:
                val_acc_tracking.append(curr_val_loss.item())
            if args.track_memory:
                mem_alloc_tracker.append(format_metrics_to_gb(torch.cuda.memory_allocated()))
                mem_reserved_tracker.append(format_metrics_to_gb(torch.cuda.memory_reserved()))
            print("completed save and stats zone...")

        if args.save_model and curr_val_loss < best_val_loss:
            if rank == 0:
                print("--> entering save model state")
            save_policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, save_policy):
                cpu_state = model.state_dict()
            if rank == 0:
                print("--> saving model ...")
                currEpoch = "-" + str(epoch) + "-" + str(round(curr_val_loss.item(), 4)) + ".pt"
                save_name = file_save_name + "-" + time_of_run + "-" + currEpoch
                print(f"--> saving as model name {save_name}")
                torch.save(cpu_state, save_name)

        if curr_val_loss < best_val_loss:
            best_val_loss = curr_val_loss
            if rank == 0:
                print(f"-->>>> New Val Loss Record: {best_val_loss}")

    dist.barrier()
    cleanup()


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description='PyTorch T5 FSDP Example')
    parser.add_argument('--model_name_or_path', default="t5-base")
    parser.add_argument('--batch-size', type=int, default=4)
    parser.add_argument('--test-batch-size', type=int, default=4)
    parser.add_argument('--epochs', type=int, default=2)
    parser.add_argument('--lr', type=float, default=.002)
    parser.add_argument('--gamma', type=float, default=0.7)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--track_memory', action='store_false', default=True)
    parser.add_argument('--run_validation', action='store_false', default=True)
    parser.add_argument('--save-model', action='store_false', default=True)
    parser.add_argument('--input-length', type=int, default=512)
    parser.add_argument('--output-length', type=int, default=150)
    parser.add_argument('--train-samples', type=int, default=1500)
    parser.add_argument('--val-samples', type=int, default=300)
    parser.add_argument('--no-decoder-cache', action='store_true')
    args = parser.parse_args()
    CALL_OPTIONS = {"use_cache": False} if args.no_decoder_cache else {}
    torch.manual_seed(args.seed)
    fsdp_main(args)
