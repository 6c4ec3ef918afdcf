"""Toy images a reader recognises, and their exact denoiser.

Latent space and a whole pipeline trace need pictures, not 2-D points. This module
draws small RGB images of shapes (discs, squares, horizontal and vertical bars) in a
few colours, sizes and positions, from a seed, in milliseconds:

- ``images``: ``(K, 3, 32, 32)`` float64 in ``[-1, 1]``, the range SD's VAE takes
  (axis 1 = RGB channels, axes 2-3 = rows, columns);
- ``labels``: ``(K,)`` int, the shape class (``SHAPES``), which conditions like a prompt.

The exact denoiser of a *finite* training set is closed-form. For
``x_t = alpha_t x0 + sigma_t eps`` with ``x0`` drawn uniformly from the K images,

    E[x0 | x_t] = sum_k softmax_k( -|x_t - alpha_t x_k|^2 / (2 sigma_t^2) ) x_k,

a softmax-weighted average of the training images. ``FiniteSet`` computes it for
arrays of any trailing shape (pixels ``(N, 3, 32, 32)`` or latents ``(N, 4, 4, 4)``),
so ``labkit.ExactDenoiser(FiniteSet(...), alphas_cumprod)`` is a perfect "UNet" for
this data. It is the *memorising* optimum: sampled exactly, it returns training
images, which is what a network that minimised the training loss perfectly would
do. Trained networks on enough data generalise instead: their inductive biases make
them learn a smoother density than the finite set's (Kadkhodaie et al., 2023,
arXiv:2310.02557, show two networks trained on disjoint halves converging to the
same one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: class label -> shape name
SHAPES = ("disc", "square", "hbar", "vbar")
#: RGB in [-1, 1]: red, green, blue, yellow
COLOURS = np.array(
    [[0.9, -0.7, -0.7], [-0.7, 0.8, -0.6], [-0.6, -0.5, 0.9], [0.9, 0.8, -0.8]], dtype=np.float64
)
BACKGROUND = -0.8  # a dark grey, the same in every channel
SIZE = 32


@dataclass(frozen=True)
class ToyImages:
    images: np.ndarray  # (K, 3, 32, 32) float64 in [-1, 1]
    labels: np.ndarray  # (K,) int: index into SHAPES
    colours: np.ndarray  # (K,) int: index into COLOURS


def _masks(shape: np.ndarray, cy: np.ndarray, cx: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Soft 0..1 masks (K, 32, 32), one pixel of anti-aliasing at the edges."""
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    dy = yy[None] - cy[:, None, None]  # (K, 32, 32) offsets from each shape's centre
    dx = xx[None] - cx[:, None, None]
    r = r[:, None, None]
    thin = np.maximum(r / 3.0, 1.5)
    # signed "inside depth" per shape; the mask is that depth clipped to [0, 1]
    depth = np.select(
        [shape[:, None, None] == k for k in range(len(SHAPES))],
        [
            r - np.sqrt(dy**2 + dx**2),  # disc
            r - np.maximum(np.abs(dy), np.abs(dx)),  # square
            np.minimum(thin - np.abs(dy), 1.5 * r - np.abs(dx)),  # horizontal bar
            np.minimum(thin - np.abs(dx), 1.5 * r - np.abs(dy)),  # vertical bar
        ],
    )
    return np.clip(depth + 0.5, 0.0, 1.0)


def toy_images(n: int = 256, seed: int = 0) -> ToyImages:
    """``n`` images of random shape, colour, size (radius 5-9 px) and position."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    labels = rng.integers(len(SHAPES), size=n)
    colours = rng.integers(len(COLOURS), size=n)
    r = rng.integers(5, 10, size=n).astype(np.float64)
    cy, cx = rng.integers(10, 23, size=(2, n)).astype(np.float64)
    mask = _masks(labels, cy, cx, r)[:, None]  # (n, 1, 32, 32), broadcast over RGB
    colour = COLOURS[colours][:, :, None, None]  # (n, 3, 1, 1)
    images = BACKGROUND + mask * (colour - BACKGROUND)  # (n, 3, 32, 32)
    return ToyImages(images=images, labels=labels, colours=colours)


@dataclass(frozen=True)
class FiniteSet:
    """A finite training set as a data distribution: uniform over ``points``.

    ``points`` is ``(K, *shape)`` (images or latents), ``classes`` ``(K,)``. It offers
    what ``labkit.ExactDenoiser`` needs of a data distribution: ``posterior_mean`` and
    ``restrict``.
    """

    points: np.ndarray
    classes: np.ndarray

    def __post_init__(self) -> None:
        if len(self.points) != len(self.classes) or len(self.points) == 0:
            raise ValueError("points (K, ...) and classes (K,) must agree on K > 0")

    def restrict(self, class_label: int) -> FiniteSet:
        """The training points of one class: the conditional data distribution."""
        keep = self.classes == class_label
        if not keep.any():
            raise ValueError(f"no training point has class {class_label}")
        return FiniteSet(self.points[keep], self.classes[keep])

    def weights(self, x_t: np.ndarray, alpha_t: float, sigma_t: float) -> np.ndarray:
        """p(x0 = x_k | x_t), shape (N, K): the softmax over training points."""
        flat = self.points.reshape(len(self.points), -1)  # (K, D)
        x = x_t.reshape(len(x_t), -1)  # (N, D)
        # |x - a x_k|^2 = |x|^2 - 2a x.x_k + a^2 |x_k|^2; |x|^2 is the same for every k
        logits = (2 * alpha_t * x @ flat.T - alpha_t**2 * np.sum(flat**2, axis=1)) / (
            2 * max(sigma_t, 1e-12) ** 2
        )
        logits -= logits.max(axis=1, keepdims=True)
        w = np.exp(logits)
        return w / w.sum(axis=1, keepdims=True)

    def posterior_mean(self, x_t: np.ndarray, alpha_t: float, sigma_t: float) -> np.ndarray:
        """E[x0 | x_t] for x_t = alpha_t x0 + sigma_t eps; ``x_t`` (N, *shape) -> same shape."""
        w = self.weights(x_t, alpha_t, sigma_t)  # (N, K)
        flat = self.points.reshape(len(self.points), -1)
        return (w @ flat).reshape(x_t.shape)

    def nearest(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Index of the nearest training point (N,) and the RMS distance to it (N,)."""
        flat = self.points.reshape(len(self.points), -1)
        x = samples.reshape(len(samples), -1)
        d2 = np.sum(x**2, axis=1)[:, None] - 2 * x @ flat.T + np.sum(flat**2, axis=1)[None]
        idx = d2.argmin(axis=1)
        rms = np.sqrt(np.maximum(d2[np.arange(len(x)), idx], 0.0) / flat.shape[1])
        return idx, rms


def image_grid(images: np.ndarray, columns: int = 8, pad: int = 1) -> np.ndarray:
    """``(N, 3, H, W)`` in [-1, 1] -> one ``(rows*(H+pad)+pad, cols*(W+pad)+pad, 3)`` uint8 RGB."""
    n, c, h, w = images.shape
    rows = -(-n // columns)
    grid = np.full((rows * (h + pad) + pad, columns * (w + pad) + pad, c), 255, dtype=np.uint8)
    pixels = np.clip((images.transpose(0, 2, 3, 1) + 1) * 127.5, 0, 255).round().astype(np.uint8)
    for i in range(n):
        top, left = pad + (i // columns) * (h + pad), pad + (i % columns) * (w + pad)
        grid[top : top + h, left : left + w] = pixels[i]
    return grid
