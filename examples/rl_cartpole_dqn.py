"""Reinforcement learning with the model layer: a DQN agent learns to balance CartPole.

There is no dataset: the agent generates its own experience. A numpy CartPole simulator (the
classic Barto-Sutton-Anderson dynamics, several copies stepped at once) is driven by an
epsilon-greedy policy over a Q-network's outputs; every transition goes into a replay buffer,
and the network is trained on random minibatches of that buffer with a hand-stepped
``ggml_trainer``. The bootstrap targets come from a *target network*: a frozen
``trainer.snapshot()`` of the weights, refreshed every few hundred steps, that ``ggml_predict``
runs like a model. An untrained policy keeps the pole up for ~20 steps; after ~100 episodes the
agent averages 150-250, and by episode 400 (about a minute on one CPU core) 200-400, some
seeds the cap of 500. ``--quick`` (150 episodes, ~15 s) ends around 130-250. DQN on CartPole is
noisy from seed to seed; ``--plot`` shows the learning curve.

Usage: python examples/rl_cartpole_dqn.py [--episodes 400] [--backend cpu] [--seed 0]
       [--quick] [--plot returns.png]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import ggmlpy as g


# Hyperparameters. "transitions" are environment steps summed over the parallel cart-poles.
HP = dict(
    n_envs=8,            # cart-poles stepped together: one predict call acts for all of them
    hidden=64, lr=1e-3, batch=64, gamma=0.99,
    updates_per_step=4,  # training steps per vector step of 8 transitions (replay ratio 0.5)
    target_every=256,    # transitions between target-network refreshes (here 128 training steps);
                         # each refresh lets values look one step further ahead, so not too rarely
    eps_decay=5_000,     # transitions over which epsilon falls linearly from 1 ...
    eps_min=0.04,        # ... to this
    warmup=1_000,        # transitions collected before the first training step
    buffer=50_000,       # replay capacity (transitions)
)


class CartPole:
    """``n`` independent cart-poles stepped together (vectorised Euler integration)."""
    GRAVITY, M_CART, M_POLE, HALF_LEN, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    THETA_MAX, X_MAX, MAX_STEPS = 12 * 2 * np.pi / 360, 2.4, 500

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        self.rng = rng
        self.state = rng.uniform(-0.05, 0.05, (n, 4))   # x, x_dot, theta, theta_dot
        self.steps = np.zeros(n, dtype=np.int64)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Push left (0) or right (1). Returns (next states, fell, episode over); finished
        cart-poles restart, so ``self.state`` is always the state to act on next."""
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(action == 1, self.FORCE, -self.FORCE)
        cos, sin = np.cos(theta), np.sin(theta)
        total, pole_ml = self.M_CART + self.M_POLE, self.M_POLE * self.HALF_LEN
        temp = (force + pole_ml * theta_dot ** 2 * sin) / total
        theta_acc = (self.GRAVITY * sin - cos * temp) / (
            self.HALF_LEN * (4.0 / 3.0 - self.M_POLE * cos ** 2 / total))
        x_acc = temp - pole_ml * theta_acc * cos / total
        nxt = np.stack([x + self.TAU * x_dot, x_dot + self.TAU * x_acc,
                        theta + self.TAU * theta_dot, theta_dot + self.TAU * theta_acc], axis=1)
        self.steps += 1
        fell = (np.abs(nxt[:, 0]) > self.X_MAX) | (np.abs(nxt[:, 2]) > self.THETA_MAX)
        over = fell | (self.steps >= self.MAX_STEPS)
        self.state = nxt.copy()
        self.state[over] = self.rng.uniform(-0.05, 0.05, (int(over.sum()), 4))
        self.steps[over] = 0
        return nxt, fell, over


class Replay:
    """A ring buffer of transitions (s, a, r, s', terminal) in preallocated numpy arrays."""

    def __init__(self, capacity: int) -> None:
        self.s, self.s2 = np.zeros((capacity, 4), np.float32), np.zeros((capacity, 4), np.float32)
        self.a = np.zeros(capacity, np.int64)
        self.r, self.term = np.zeros(capacity, np.float32), np.zeros(capacity, np.float32)
        self.capacity, self.size, self.head = capacity, 0, 0

    def add(self, s, a, r, s2, term) -> None:
        idx = (self.head + np.arange(len(s))) % self.capacity
        self.s[idx], self.a[idx], self.r[idx], self.s2[idx], self.term[idx] = s, a, r, s2, term
        self.head = (self.head + len(s)) % self.capacity
        self.size = min(self.size + len(s), self.capacity)

    def sample(self, n: int, rng: np.random.Generator):
        i = rng.integers(0, self.size, n)
        return self.s[i], self.a[i], self.r[i], self.s2[i], self.term[i]


def q_network(backend: str):
    """4 state variables -> two hidden ReLU layers -> one Q-value per action (linear)."""
    model = g.ggml_model_sequential()
    model = g.ggml_layer_dense(model, HP["hidden"], activation="relu", input_shape=(4,))
    model = g.ggml_layer_dense(model, HP["hidden"], activation="relu")
    model = g.ggml_layer_dense(model, 2)
    # MSE rather than Huber: the Q-values grow towards ~1/(1 - gamma) = 100, and Huber's gradient,
    # capped at error 1, makes them catch up slowly (measured: lower and less steady returns).
    return g.ggml_compile(model, optimizer="adam", loss="mse", metrics=[], learning_rate=HP["lr"], backend=backend)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=None, help="episodes to play (default 400; --quick 150)")
    ap.add_argument("--backend", default="auto", choices=["auto", "cpu", "vulkan", "cuda"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="a short run (tests)")
    ap.add_argument("--plot", default=None, help="save a PNG of the episode returns here")
    args = ap.parse_args(argv)
    episodes = args.episodes or (150 if args.quick else 400)
    n_envs, batch, gamma, log_every = HP["n_envs"], HP["batch"], HP["gamma"], 10 if args.quick else 25
    # (The graphs are tiny: the model layer runs them on one CPU thread, which beats several that mostly
    # wait on each other; ggml_set_n_threads would override that choice.)
    np.random.seed(args.seed)                   # the network's initial weights
    rng = np.random.default_rng(args.seed)      # environments, exploration, replay sampling

    model = q_network(args.backend)
    env, replay = CartPole(n_envs, rng), Replay(HP["buffer"])
    returns: list[float] = []
    ep_len = np.zeros(n_envs)
    rows = np.arange(batch)
    t0 = time.perf_counter()
    with g.ggml_trainer(model, batch_size=batch) as tr:
        target = tr.snapshot()
        try:
            step = 0
            while len(returns) < episodes:
                # Act: epsilon-greedy (explore a lot at first, then mostly exploit what was learned).
                eps = max(HP["eps_min"], 1.0 - step * n_envs / HP["eps_decay"])
                s = env.state.astype(np.float32)
                greedy = g.ggml_predict(model, s, batch_size=n_envs).argmax(axis=1)
                a = np.where(rng.random(n_envs) < eps, rng.integers(0, 2, n_envs), greedy)
                s2, fell, over = env.step(a)
                # Only a fall is terminal; the 500-step cap is a time limit, so there we still bootstrap.
                replay.add(s, a, np.ones(n_envs), s2, fell)
                ep_len += 1
                returns += ep_len[over].tolist()
                ep_len[over] = 0
                step += 1
                if len(returns) // log_every != (len(returns) - over.sum()) // log_every:
                    print(f"episode {len(returns):4d}: mean return of the last {log_every} "
                          f"{np.mean(returns[-log_every:]):6.1f}  epsilon {eps:.2f}  "
                          f"{time.perf_counter() - t0:5.1f} s", flush=True)
                if replay.size < HP["warmup"]:
                    continue
                for _ in range(HP["updates_per_step"]):
                    bs, ba, br, bs2, bterm = replay.sample(batch, rng)
                    # Double DQN: the online network picks the next action, the target network values
                    # it (a max over the target's own estimates is biased upwards). One call: Q(s), Q(s').
                    q = g.ggml_predict(model, np.concatenate([bs, bs2]), batch_size=2 * batch)
                    y, a2 = q[:batch], q[batch:].argmax(axis=1)
                    q_next = g.ggml_predict(target, bs2, batch_size=batch)[rows, a2]
                    # Bellman target for the taken action only; the other entry keeps the network's own
                    # prediction, so the loss over both outputs has no gradient there.
                    y[rows, ba] = br + gamma * q_next * (1.0 - bterm)
                    tr.step(bs, y)
                if step % (HP["target_every"] // n_envs) == 0:  # a target that holds still for a while
                    g.ggml_snapshot_free(target)                 # keeps the regression from chasing itself
                    target = tr.snapshot()
        finally:
            g.ggml_snapshot_free(target)
        n_train = tr.n_steps()
    elapsed = time.perf_counter() - t0

    first, last = np.mean(returns[:20]), np.mean(returns[-20:])
    print(f"\n{len(returns)} episodes, {step * n_envs} environment steps, {n_train} training steps "
          f"in {elapsed:.1f} s")
    print(f"mean return: first 20 episodes {first:.1f} -> last 20 episodes {last:.1f} (max 500)")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(returns, lw=0.8, alpha=0.6, label="episode return")
        k = min(20, len(returns))
        ax.plot(np.arange(k - 1, len(returns)), np.convolve(returns, np.ones(k) / k, "valid"),
                label=f"mean of the last {k}")
        ax.set(xlabel="episode", ylabel="return (steps balanced)", title="DQN on CartPole (ggmlpy)")
        ax.legend()
        fig.savefig(args.plot, dpi=100, bbox_inches="tight")
        print(f"plot saved to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
