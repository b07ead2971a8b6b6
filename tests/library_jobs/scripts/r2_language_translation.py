"""pytorch/examples language_translation/main.py: a Transformer translation model trained on
Multi30k, its data pipeline from torchtext (`Multi30k`, `get_tokenizer`, `build_vocab_from_iterator`)
and spaCy tokenizers. Imports torchtext first, as the original's src/data.py does."""

import argparse

import torch
import torch.nn as nn
from torchtext.data.utils import get_tokenizer
from torchtext.datasets import Multi30k
from torchtext.vocab import build_vocab_from_iterator

parser = argparse.ArgumentParser(description="PyTorch Language Translation")
parser.add_argument("--src", default="de")
parser.add_argument("--tgt", default="en")
parser.add_argument("--epochs", type=int, default=30)
parser.add_argument("--batch", type=int, default=128)
parser.add_argument("--dim_model", type=int, default=512)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
src_tokenizer = get_tokenizer("spacy", language="de_core_news_sm")
tgt_tokenizer = get_tokenizer("spacy", language="en_core_web_sm")
train_iterator = Multi30k(split="train", language_pair=(args.src, args.tgt))
src_vocab = build_vocab_from_iterator((src_tokenizer(s) for s, _ in train_iterator), min_freq=1,
                                      specials=["<unk>", "<pad>", "<bos>", "<eos>"], special_first=True)
model = nn.Transformer(d_model=args.dim_model, batch_first=True).to(device)
