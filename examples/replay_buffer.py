"""RL-style training: a simulator fills a replay buffer while a dynamics model trains on it.

There is no dataset here. A small noisy pendulum simulator is stepped by an exploring
policy; every transition (state, action) -> next state goes into a replay buffer. The
training source is an *infinite callable*: each call first advances the simulator a few
steps (so the buffer grows while training runs, within and between epochs) and then
samples a random minibatch from the buffer. Because it never ends, ``steps_per_epoch``
says where an epoch stops. A second infinite callable rolls out fresh, never-stored
transitions for validation (``validation_steps`` batches per epoch).

The model (MLP 4 -> 64 -> 64 -> 2, MSE, AdamW) learns to predict the change of angle and
angular velocity; the validation loss is its error on new experience. Runs in seconds.
Usage: python examples/replay_buffer.py [--epochs 12] [--steps 60] [--env-steps 8]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import ggmlpy as G


N_IN, N_HIDDEN, N_OUT = 4, 64, 2      # (sin th, cos th, omega, u) -> (d th, d omega) / dt
BATCH = 128
DT, GRAVITY, NOISE = 0.05, 9.81, 0.02


class Pendulum:
    """A damped pendulum with torque u in [-2, 2] and process noise; restarts now and then."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.reset()

    def reset(self) -> None:
        self.theta = self.rng.uniform(-np.pi, np.pi)
        self.omega = self.rng.uniform(-1.0, 1.0)

    def step(self, u: float) -> tuple[np.ndarray, np.ndarray]:
        """Apply u; returns the model input and the (scaled) change of state."""
        x = np.array([np.sin(self.theta), np.cos(self.theta), self.omega, u], dtype=np.float32)
        alpha = -GRAVITY * np.sin(self.theta) - 0.1 * self.omega + u
        omega = self.omega + DT * alpha + self.rng.normal(0, NOISE)
        theta = self.theta + DT * omega
        y = np.array([(theta - self.theta) / DT, (omega - self.omega) / DT], dtype=np.float32)
        self.theta = (theta + np.pi) % (2 * np.pi) - np.pi
        self.omega = float(np.clip(omega, -8.0, 8.0))
        if self.rng.random() < 0.01:
            self.reset()
        return x, y


def policy(env: Pendulum, rng: np.random.Generator) -> float:
    """Exploration: a noisy energy-pumping controller (reaches many different states)."""
    return float(np.clip(1.5 * np.sign(env.omega * np.cos(env.theta) + 1e-3) + rng.normal(0, 1.0), -2, 2))


class ReplayBuffer:
    def __init__(self, capacity: int) -> None:
        self.x = np.zeros((capacity, N_IN), dtype=np.float32)
        self.y = np.zeros((capacity, N_OUT), dtype=np.float32)
        self.capacity, self.size, self.head = capacity, 0, 0

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x[self.head], self.y[self.head] = x, y
        self.head = (self.head + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, self.size, n)
        return self.x[idx], self.y[idx]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--steps", type=int, default=60, help="training batches per epoch (steps_per_epoch)")
    ap.add_argument("--env-steps", type=int, default=8, help="simulator steps per training batch")
    ap.add_argument("--capacity", type=int, default=20_000, help="replay buffer capacity")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    rng = np.random.default_rng(args.seed)

    env = Pendulum(rng)
    buffer = ReplayBuffer(args.capacity)
    for _ in range(BATCH):                      # warm-up: enough for the first minibatch
        buffer.add(*env.step(policy(env, rng)))

    def train_source():
        """Infinite: act in the simulator, store the experience, sample a minibatch."""
        for _ in range(args.env_steps):
            buffer.add(*env.step(policy(env, rng)))
        return buffer.sample(BATCH, rng)        # (BATCH, 4) and (BATCH, 2): ggml layout for [4|2, BATCH]

    val_rng = np.random.default_rng(args.seed + 1)
    val_env = Pendulum(val_rng)

    def val_source():
        """Infinite: fresh transitions from a separate simulator, never stored."""
        pairs = [val_env.step(policy(val_env, val_rng)) for _ in range(BATCH)]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])

    # ---- model: 4 -> 64 -> 64 -> 2, ReLU between the layers
    backend = G.ggml_backend_cpu_init()
    ctx_static = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    shapes = [(N_IN, N_HIDDEN), (N_HIDDEN, N_HIDDEN), (N_HIDDEN, N_OUT)]
    weights = [G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, a, b) for a, b in shapes]
    biases = [G.ggml_new_tensor_1d(ctx_static, G.GGML_TYPE_F32, b) for _, b in shapes]
    for t in weights + biases:
        G.ggml_set_param(t)
    inputs = G.ggml_new_tensor_2d(ctx_static, G.GGML_TYPE_F32, N_IN, BATCH)
    G.ggml_set_input(inputs)
    model_buffer = G.ggml_backend_alloc_ctx_tensors(ctx_static, backend)
    for w, b, (n_in, n_out) in zip(weights, biases, shapes):
        G.ggml_backend_tensor_set_data(w, rng.normal(0, np.sqrt(2 / n_in), (n_out, n_in)).astype(np.float32))
        G.ggml_backend_tensor_set_data(b, np.zeros(n_out, np.float32))
    ctx_compute = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    h = inputs
    for i, (w, b) in enumerate(zip(weights, biases)):
        h = G.ggml_add(ctx_compute, G.ggml_mul_mat(ctx_compute, w, h), b)
        if i < len(weights) - 1:
            h = G.ggml_relu(ctx_compute, h)
    outputs = h
    sched = G.ggml_backend_sched_new([backend])

    def report(epoch, logs, state):
        print(f"epoch {epoch:2d}: train_loss {logs['train_loss']:.4f}  val_loss (new experience) "
              f"{logs['val_loss']:.4f}  buffer {buffer.size:,} transitions")

    history = G.ggml_fit_opt_gen(sched, ctx_compute, inputs, outputs, train_source, steps_per_epoch=args.steps,
                                 epochs=args.epochs, validation_generator=val_source, validation_steps=4,
                                 loss_type=G.ggml_opt_loss_type_mse(), callbacks=[{"on_epoch_end": report}],
                                 silent=True)
    G.ggml_backend_sched_free(sched)
    G.ggml_free(ctx_compute)
    G.ggml_backend_buffer_free(model_buffer)
    G.ggml_free(ctx_static)
    G.ggml_backend_free(backend)

    first, last = history["val_loss"].iloc[0], history["val_loss"].iloc[-1]
    floor = ((NOISE / DT) ** 2 + NOISE ** 2) / 2   # the simulator's process noise: no model can go below
    print(f"\nval_loss {first:.4f} -> {last:.4f} ({first / last:.1f}x lower; noise floor {floor:.3f}) "
          f"over {len(history)} epochs; "
          f"{int(history['steps'].sum())} minibatches from a buffer that grew to {buffer.size:,} transitions; "
          f"{time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
