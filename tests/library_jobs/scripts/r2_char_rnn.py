# ruff: noqa: UP031, B007  (kept as the original script writes it)
"""char-rnn (karpathy / spro practical-pytorch char-rnn-generation style): a GRU language model
on one text file, random chunks, hidden state detached between chunks (truncated BPTT), then
sampling from a primer with temperature, saving the model with torch.save."""

import argparse
import os
import random
import string
import time

import torch
import torch.nn as nn

argparser = argparse.ArgumentParser()
argparser.add_argument("filename", nargs="?", default="")
argparser.add_argument("--model", type=str, default="gru")
argparser.add_argument("--n_epochs", type=int, default=20)
argparser.add_argument("--print_every", type=int, default=10)
argparser.add_argument("--hidden_size", type=int, default=100)
argparser.add_argument("--n_layers", type=int, default=2)
argparser.add_argument("--learning_rate", type=float, default=0.01)
argparser.add_argument("--chunk_len", type=int, default=50)
argparser.add_argument("--batch_size", type=int, default=16)
argparser.add_argument("--cuda", action="store_true")
argparser.add_argument("--save", default="")
args = argparser.parse_args()

all_characters = string.printable
n_characters = len(all_characters)

if args.filename:
    with open(args.filename) as f:
        file = f.read()
else:
    random.seed(0)
    file = "".join(random.choice(string.ascii_letters + " .\n") for _ in range(5000))
file_len = len(file)


def char_tensor(s):
    tensor = torch.zeros(len(s)).long()
    for c in range(len(s)):
        try:
            tensor[c] = all_characters.index(s[c])
        except ValueError:
            continue
    return tensor


class CharRNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size, model="gru", n_layers=1):
        super().__init__()
        self.model = model.lower()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.n_layers = n_layers
        self.encoder = nn.Embedding(input_size, hidden_size)
        if self.model == "gru":
            self.rnn = nn.GRU(hidden_size, hidden_size, n_layers)
        elif self.model == "lstm":
            self.rnn = nn.LSTM(hidden_size, hidden_size, n_layers)
        self.decoder = nn.Linear(hidden_size, output_size)

    def forward(self, input, hidden):
        batch_size = input.size(0)
        encoded = self.encoder(input)
        output, hidden = self.rnn(encoded.view(1, batch_size, -1), hidden)
        output = self.decoder(output.view(batch_size, -1))
        return output, hidden

    def init_hidden(self, batch_size):
        if self.model == "lstm":
            return (torch.zeros(self.n_layers, batch_size, self.hidden_size),
                    torch.zeros(self.n_layers, batch_size, self.hidden_size))
        return torch.zeros(self.n_layers, batch_size, self.hidden_size)


def random_training_set(chunk_len, batch_size):
    inp = torch.LongTensor(batch_size, chunk_len)
    target = torch.LongTensor(batch_size, chunk_len)
    for bi in range(batch_size):
        start_index = random.randint(0, file_len - chunk_len - 1)
        end_index = start_index + chunk_len + 1
        chunk = file[start_index:end_index]
        inp[bi] = char_tensor(chunk[:-1])
        target[bi] = char_tensor(chunk[1:])
    if args.cuda:
        inp = inp.cuda()
        target = target.cuda()
    return inp, target


def generate(decoder, prime_str="A", predict_len=100, temperature=0.8, cuda=False):
    hidden = decoder.init_hidden(1)
    prime_input = char_tensor(prime_str).unsqueeze(0)
    if cuda:
        hidden = hidden.cuda()
        prime_input = prime_input.cuda()
    predicted = prime_str
    for p in range(len(prime_str) - 1):
        _, hidden = decoder(prime_input[:, p], hidden)
    inp = prime_input[:, -1]
    for p in range(predict_len):
        output, hidden = decoder(inp, hidden)
        output_dist = output.data.view(-1).div(temperature).exp()
        top_i = torch.multinomial(output_dist, 1)[0]
        predicted_char = all_characters[top_i]
        predicted += predicted_char
        inp = char_tensor(predicted_char).unsqueeze(0)
        if cuda:
            inp = inp.cuda()
    return predicted


def time_since(since):
    s = time.time() - since
    return "%dm %ds" % (s // 60, s % 60)


def train(inp, target):
    hidden = decoder.init_hidden(args.batch_size)
    if args.cuda:
        hidden = hidden.cuda()
    decoder.zero_grad()
    loss = 0
    for c in range(args.chunk_len):
        output, hidden = decoder(inp[:, c], hidden)
        loss += criterion(output.view(args.batch_size, -1), target[:, c])
        if (c + 1) % 10 == 0:  # truncated BPTT inside the chunk
            hidden = hidden.detach()
    loss.backward()
    decoder_optimizer.step()
    return loss.item() / args.chunk_len


def save():
    save_filename = args.save or os.path.splitext(os.path.basename(args.filename or "random"))[0] + ".pt"
    torch.save(decoder, save_filename)
    print("Saved as %s" % save_filename)


decoder = CharRNN(n_characters, args.hidden_size, n_characters, model=args.model, n_layers=args.n_layers)
decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=args.learning_rate)
criterion = nn.CrossEntropyLoss()
if args.cuda:
    decoder.cuda()

start = time.time()
all_losses = []
loss_avg = 0
try:
    print("Training for %d epochs..." % args.n_epochs)
    for epoch in range(1, args.n_epochs + 1):
        loss = train(*random_training_set(args.chunk_len, args.batch_size))
        loss_avg += loss
        if epoch % args.print_every == 0:
            print("[%s (%d %d%%) %.4f]" % (time_since(start), epoch, epoch / args.n_epochs * 100, loss))
            print(generate(decoder, "Wh", 100, cuda=args.cuda), "\n")
    print("Saving...")
    save()
except KeyboardInterrupt:
    print("Saving before quit...")
    save()
