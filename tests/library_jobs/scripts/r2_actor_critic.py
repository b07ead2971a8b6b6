# ruff: noqa: B007  (kept as the original script writes it)
"""pytorch/examples reinforcement_learning/actor_critic.py: a shared-body Policy with action and
value heads, `gym.make("CartPole-v1")`, SavedAction namedtuples, returns normalised with eps,
smooth_l1_loss for the critic, Adam(lr=3e-2). Imports gym first, as the original does."""

import argparse
from collections import namedtuple
from itertools import count

import gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

parser = argparse.ArgumentParser(description="PyTorch actor-critic example")
parser.add_argument("--gamma", type=float, default=0.99, metavar="G")
parser.add_argument("--seed", type=int, default=543, metavar="N")
parser.add_argument("--render", action="store_true")
parser.add_argument("--log-interval", type=int, default=10, metavar="N")
args = parser.parse_args()

env = gym.make("CartPole-v1")
env.reset(seed=args.seed)
torch.manual_seed(args.seed)
SavedAction = namedtuple("SavedAction", ["log_prob", "value"])


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.action_head = nn.Linear(128, 2)
        self.value_head = nn.Linear(128, 1)
        self.saved_actions = []
        self.rewards = []

    def forward(self, x):
        x = F.relu(self.affine1(x))
        return F.softmax(self.action_head(x), dim=-1), self.value_head(x)


model = Policy()
optimizer = optim.Adam(model.parameters(), lr=3e-2)
eps = np.finfo(np.float32).eps.item()


def select_action(state):
    state = torch.from_numpy(state).float()
    probs, state_value = model(state)
    m = Categorical(probs)
    action = m.sample()
    model.saved_actions.append(SavedAction(m.log_prob(action), state_value))
    return action.item()


def finish_episode():
    R = 0
    policy_losses, value_losses, returns = [], [], []
    for r in model.rewards[::-1]:
        R = r + args.gamma * R
        returns.insert(0, R)
    returns = torch.tensor(returns)
    returns = (returns - returns.mean()) / (returns.std() + eps)
    for (log_prob, value), R in zip(model.saved_actions, returns, strict=True):
        advantage = R - value.item()
        policy_losses.append(-log_prob * advantage)
        value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
    optimizer.zero_grad()
    loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
    loss.backward()
    optimizer.step()
    del model.rewards[:]
    del model.saved_actions[:]


def main():
    running_reward = 10
    for i_episode in count(1):
        state, _ = env.reset()
        ep_reward = 0
        for _t in range(1, 10000):
            action = select_action(state)
            state, reward, done, _, _ = env.step(action)
            model.rewards.append(reward)
            ep_reward += reward
            if done:
                break
        running_reward = 0.05 * ep_reward + (1 - 0.05) * running_reward
        finish_episode()
        if running_reward > env.spec.reward_threshold:
            print(f"Solved! Running reward is now {running_reward}")
            break


if __name__ == "__main__":
    main()
