"""Direct Preference Optimization written by hand, as TRL's documentation describes DPOTrainer's
loss (trl is not installed): huggingface/trl `trl/trainer/dpo_trainer.py` (`concatenated_forward`,
`get_batch_logps`, `dpo_loss` with the sigmoid loss) and docs/source/dpo_trainer.md.

A policy and a frozen reference copy of the same checkpoint, both on the device; each batch of
(prompt, chosen, rejected) is tokenized, chosen and rejected are run through each model in one
concatenated forward; the reference's log-probabilities are computed under `torch.no_grad()`;
loss = -logsigmoid(beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))).
"""

import argparse
import json
import random

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, get_scheduler


def parse_args():
    parser = argparse.ArgumentParser(description="DPO on a preference data set (JSON lines)")
    parser.add_argument("--model_name_or_path", type=str, required=True)
    parser.add_argument("--train_file", type=str, required=True, help="prompt / chosen / rejected")
    parser.add_argument("--per_device_train_batch_size", type=int, default=2)
    parser.add_argument("--max_length", type=int, default=48)
    parser.add_argument("--learning_rate", type=float, default=5e-6)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--max_steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def get_batch_logps(logits, labels, label_pad_token_id=-100):
    """Sum of the log-probabilities of the labels (the completion tokens) per sequence."""
    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    loss_mask = labels != label_pad_token_id
    labels[labels == label_pad_token_id] = 0
    per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    return (per_token_logps * loss_mask).sum(-1)


def tokenize_batch(tokenizer, rows, max_length, device):
    """chosen rows then rejected rows (the concatenated batch); labels mask out the prompt."""
    input_ids, labels = [], []
    for key in ("chosen", "rejected"):
        for row in rows:
            prompt = tokenizer(row["prompt"])["input_ids"]
            completion = tokenizer(row[key])["input_ids"] + [tokenizer.eos_token_id]
            ids = (prompt + completion)[:max_length]
            input_ids.append(ids)
            labels.append(([-100] * len(prompt) + completion)[:max_length])
    width = max(len(ids) for ids in input_ids)
    pad = tokenizer.pad_token_id
    batch = {
        "input_ids": torch.tensor([ids + [pad] * (width - len(ids)) for ids in input_ids]),
        "attention_mask": torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in input_ids]),
        "labels": torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels]),
    }
    return {k: v.to(device) for k, v in batch.items()}


def concatenated_forward(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = get_batch_logps(logits.float(), batch["labels"])
    half = batch["input_ids"].shape[0] // 2
    return logps[:half], logps[half:]


def dpo_loss(policy_chosen, policy_rejected, reference_chosen, reference_rejected, beta):
    logits = (policy_chosen - policy_rejected) - (reference_chosen - reference_rejected)
    losses = -F.logsigmoid(beta * logits)
    chosen_rewards = beta * (policy_chosen - reference_chosen).detach()
    rejected_rewards = beta * (policy_rejected - reference_rejected).detach()
    return losses, chosen_rewards, rejected_rewards


def main():
    args = parse_args()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).to(device)
    ref_model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).to(device)
    ref_model.eval()
    for p in ref_model.parameters():
        p.requires_grad_(False)

    with open(args.train_file) as f:
        rows = [json.loads(line) for line in f if line.strip()]

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=args.max_steps)
    model.train()
    step = 0
    while step < args.max_steps:
        random.shuffle(rows)
        for start in range(0, len(rows) - args.per_device_train_batch_size + 1, args.per_device_train_batch_size):
            batch = tokenize_batch(tokenizer, rows[start:start + args.per_device_train_batch_size],
                                   args.max_length, device)
            policy_chosen, policy_rejected = concatenated_forward(model, batch)
            with torch.no_grad():
                reference_chosen, reference_rejected = concatenated_forward(ref_model, batch)
            losses, chosen_rewards, rejected_rewards = dpo_loss(
                policy_chosen, policy_rejected, reference_chosen, reference_rejected, args.beta)
            loss = losses.mean()
            loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            accuracy = (chosen_rewards > rejected_rewards).float().mean()
            print(f"step {step}: loss {loss.item():.4f} reward accuracy {accuracy.item():.2f}")
            step += 1
            if step >= args.max_steps:
                break


if __name__ == "__main__":
    main()
