"""pytorch/tutorials beginner_source/transformer_tutorial.py (language modeling with
nn.TransformerEncoder), its data pipeline on a local text file instead of WikiText2: a
basic_english-style tokenizer and a vocabulary built from the file, `batchify` into columns on
the device, `get_batch` slices of `bptt` tokens, `TransformerModel` (Embedding * sqrt(d_model),
sin-cos PositionalEncoding buffer with dropout, TransformerEncoder of TransformerEncoderLayer,
a Linear decoder, `generate_square_subsequent_mask`), CrossEntropyLoss, SGD(lr=5.0) with
StepLR(1.0, gamma=0.95), `clip_grad_norm_(0.5)`, `evaluate()` under no_grad after each epoch
and the best model kept with `copy.deepcopy`-free `torch.save` / `load_state_dict` (the
tutorial's TemporaryDirectory checkpoint). `--batch-first` builds the layers with
batch_first=True, so evaluation takes the encoder's fused fast path
(`torch._transformer_encoder_layer_fwd`)."""

import argparse
import math
import os
import re
import time
from collections import Counter
from tempfile import TemporaryDirectory

import torch
from torch import Tensor, nn
from torch.nn import TransformerEncoder, TransformerEncoderLayer


class TransformerModel(nn.Module):
    def __init__(self, ntoken: int, d_model: int, nhead: int, d_hid: int, nlayers: int,
                 dropout: float = 0.5, batch_first: bool = False):
        super().__init__()
        self.model_type = "Transformer"
        self.batch_first = batch_first
        self.pos_encoder = PositionalEncoding(d_model, dropout)
        encoder_layers = TransformerEncoderLayer(d_model, nhead, d_hid, dropout,
                                                 batch_first=batch_first)
        self.transformer_encoder = TransformerEncoder(encoder_layers, nlayers,
                                                      enable_nested_tensor=False)
        self.embedding = nn.Embedding(ntoken, d_model)
        self.d_model = d_model
        self.linear = nn.Linear(d_model, ntoken)
        self.init_weights()

    def init_weights(self) -> None:
        initrange = 0.1
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.linear.bias.data.zero_()
        self.linear.weight.data.uniform_(-initrange, initrange)

    def forward(self, src: Tensor, src_mask: Tensor = None) -> Tensor:
        """src: [seq_len, batch_size]; returns [seq_len, batch_size, ntoken]"""
        src = self.embedding(src) * math.sqrt(self.d_model)
        src = self.pos_encoder(src)
        if src_mask is None:
            src_mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device)
        if self.batch_first:
            output = self.transformer_encoder(src.transpose(0, 1), src_mask).transpose(0, 1)
        else:
            output = self.transformer_encoder(src, src_mask)
        return self.linear(output)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.pe[:x.size(0)]
        return self.dropout(x)


def basic_english(line: str) -> list:
    return re.sub(r"([.,!?;:])", r" \1 ", line.lower()).split()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-first", action="store_true")
    parser.add_argument("--emsize", type=int, default=64)
    parser.add_argument("--nlayers", type=int, default=2)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with open(args.data) as f:
        lines = f.read().splitlines()
    counter = Counter(tok for line in lines for tok in basic_english(line))
    itos = ["<unk>"] + sorted(counter)
    vocab = {tok: i for i, tok in enumerate(itos)}

    def data_process(raw_text_iter) -> Tensor:
        data = [torch.tensor([vocab.get(t, 0) for t in basic_english(item)], dtype=torch.long)
                for item in raw_text_iter]
        return torch.cat(tuple(filter(lambda t: t.numel() > 0, data)))

    split = len(lines) * 8 // 10
    train_data, val_data = data_process(lines[:split]), data_process(lines[split:])

    def batchify(data: Tensor, bsz: int) -> Tensor:
        seq_len = data.size(0) // bsz
        data = data[:seq_len * bsz]
        data = data.view(bsz, seq_len).t().contiguous()
        return data.to(device)

    batch_size, eval_batch_size = 8, 4
    train_data = batchify(train_data, batch_size)
    val_data = batchify(val_data, eval_batch_size)
    bptt = 16

    def get_batch(source: Tensor, i: int):
        seq_len = min(bptt, len(source) - 1 - i)
        data = source[i:i + seq_len]
        target = source[i + 1:i + 1 + seq_len].reshape(-1)
        return data, target

    ntokens = len(vocab)
    model = TransformerModel(ntokens, args.emsize, 2, 2 * args.emsize, args.nlayers, 0.2,
                             batch_first=args.batch_first).to(device)
    criterion = nn.CrossEntropyLoss()
    lr = 5.0
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1.0, gamma=0.95)
    print(f"vocab {ntokens} train {tuple(train_data.shape)} val {tuple(val_data.shape)}")

    def train(model: nn.Module) -> None:
        model.train()
        total_loss = 0.0
        log_interval = 4
        start_time = time.time()
        num_batches = len(train_data) // bptt
        for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            data, targets = get_batch(train_data, i)
            output = model(data)
            output_flat = output.view(-1, ntokens)
            loss = criterion(output_flat, targets)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            total_loss += loss.item()
            if batch % log_interval == 0 and batch > 0:
                lr = scheduler.get_last_lr()[0]
                ms_per_batch = (time.time() - start_time) * 1000 / log_interval
                cur_loss = total_loss / log_interval
                print(f"| epoch {epoch:3d} | {batch:5d}/{num_batches:5d} batches | "
                      f"lr {lr:02.2f} | ms/batch {ms_per_batch:5.2f} | loss {cur_loss:5.2f}")
                total_loss = 0
                start_time = time.time()

    def evaluate(model: nn.Module, eval_data: Tensor) -> float:
        model.eval()
        total_loss = 0.0
        with torch.no_grad():
            for i in range(0, eval_data.size(0) - 1, bptt):
                data, targets = get_batch(eval_data, i)
                seq_len = data.size(0)
                output = model(data)
                output_flat = output.view(-1, ntokens)
                total_loss += seq_len * criterion(output_flat, targets).item()
        return total_loss / (len(eval_data) - 1)

    best_val_loss = float("inf")
    with TemporaryDirectory() as tempdir:
        best_model_params_path = os.path.join(tempdir, "best_model_params.pt")
        for epoch in range(1, args.epochs + 1):
            epoch_start_time = time.time()
            train(model)
            val_loss = evaluate(model, val_data)
            val_ppl = math.exp(min(val_loss, 50))
            elapsed = time.time() - epoch_start_time
            print(f"| end of epoch {epoch:3d} | time: {elapsed:5.2f}s | "
                  f"valid loss {val_loss:5.2f} | valid ppl {val_ppl:8.2f}")
            if val_loss < best_val_loss:
                best_val_loss = val_loss
                torch.save(model.state_dict(), best_model_params_path)
            scheduler.step()
        model.load_state_dict(torch.load(best_model_params_path))


if __name__ == "__main__":
    main()
