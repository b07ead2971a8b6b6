"""Stable-Baselines3's README / docs quickstart examples (docs/guide/examples.rst): `PPO("MlpPolicy",
env, device="cuda")` on CartPole-v1 and `SAC("MlpPolicy", env, device="cuda")` on Pendulum-v1,
`model.learn(total_timesteps=...)`, `model.save(...)`, `del model`, `ALGO.load(...)` and a few
`model.predict(obs, deterministic=True)` steps on the vectorised env (`model.get_env()`).
Small `n_steps` / `batch_size` / `learning_starts` keep it tiny; the algorithms are the library's.

To run: python r9_sb3_quickstart.py --algo ppo --timesteps 128
"""
import argparse

import gymnasium as gym
from stable_baselines3 import PPO, SAC

parser = argparse.ArgumentParser()
parser.add_argument("--algo", choices=["ppo", "sac"], default="ppo")
parser.add_argument("--timesteps", type=int, default=10_000)
parser.add_argument("--device", default="cuda")
parser.add_argument("--save", default=None, help="where model.save writes (default: ALGO_ENV)")
args = parser.parse_args()

if args.algo == "ppo":
    env = gym.make("CartPole-v1")
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=32, n_epochs=2, verbose=1,
                device=args.device)
    model.learn(total_timesteps=args.timesteps)
    path = args.save or "ppo_cartpole"
    model.save(path)
    del model  # remove to demonstrate saving and loading
    model = PPO.load(path, device=args.device)
else:
    env = gym.make("Pendulum-v1")
    model = SAC("MlpPolicy", env, learning_starts=32, batch_size=32, buffer_size=1000, verbose=1,
                device=args.device)
    model.learn(total_timesteps=args.timesteps, log_interval=4)
    path = args.save or "sac_pendulum"
    model.save(path)
    del model  # remove to demonstrate saving and loading
    model = SAC.load(path, device=args.device)

model.set_env(env)
vec_env = model.get_env()
obs = vec_env.reset()
for _ in range(5):
    action, _states = model.predict(obs, deterministic=True)
    obs, reward, done, info = vec_env.step(action)
print("predicted", action.shape, "on", model.device)
