"""A linear stand-in for Stable Diffusion's VAE: PCA over 8 x 8 patches.

Lab 05 teaches it; later labs import it. SD's ``AutoencoderKL`` maps an image
``(B, 3, H, W)`` in ``[-1, 1]`` to latents ``(B, 4, H/8, W/8)``: 48 times fewer numbers,
one 4-channel latent position per 8 x 8 pixel area. In the real encoder each position
depends on the whole image (its GroupNorms and mid-block self-attention mix every
position); this stand-in makes the mapping patch-local on purpose: each 8 x 8 patch
(3 x 64 = 192 numbers) becomes one position by the best *linear* map there is for that,
the top 4 principal components of the training patches (Pearson, 1901; Hotelling,
1933). It has the diffusers names a pipeline uses:

- ``encode(images) -> latents`` ``(B, 3, H, W) -> (B, 4, H/8, W/8)`` (the mean
  of the latent distribution; a linear code has no sampling step),
- ``decode(latents) -> images`` ``(B, 4, H/8, W/8) -> (B, 3, H, W)``,
- ``config.scaling_factor``: 1 / std of the training latents, the rule behind SD's
  0.18215: the latent diffusion paper (Rombach et al., 2022) rescales the KL-regularised
  latents to unit variance so that one noise schedule fits any autoencoder, and
  ``config.shift_factor`` (SD3 / Flux subtract a mean before scaling; SD 1.x has none).

What the stand-in cannot show: a real VAE is non-linear and not patch-local, so tiled
decoding is approximate there (here tiles are exact), and a latent scaled wrongly is a
non-linear distortion there (here only a change of contrast). SD's VAE was trained with
reconstruction, LPIPS and patch-discriminator losses and only a slight KL penalty (weight
1e-6 in the latent-diffusion configs), so its latents are not near N(0, I): hence
``scaling_factor``. PCA is the exact optimum among linear patch codes, so its
reconstruction error is what 4 numbers per patch keep at best *linearly*; a real,
non-linear VAE keeps more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VAEConfig:
    patch_size: int
    latent_channels: int
    scaling_factor: float
    shift_factor: float


def patchify(images: np.ndarray, p: int) -> np.ndarray:
    """``(B, C, H, W)`` -> ``(B, H/p, W/p, C*p*p)``: one row per patch."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p)
    return x.transpose(0, 2, 4, 1, 3, 5).reshape(b, h // p, w // p, c * p * p)


def unpatchify(patches: np.ndarray, c: int, p: int) -> np.ndarray:
    """Inverse of :func:`patchify`: ``(B, h, w, C*p*p)`` -> ``(B, C, h*p, w*p)``."""
    b, h, w, _ = patches.shape
    x = patches.reshape(b, h, w, c, p, p)
    return x.transpose(0, 3, 1, 4, 2, 5).reshape(b, c, h * p, w * p)


class PatchPCAAutoencoder:
    """Fit once on training images; then ``encode`` / ``decode`` like ``AutoencoderKL``."""

    def __init__(
        self,
        components: np.ndarray,
        mean: np.ndarray,
        config: VAEConfig,
        in_channels: int = 3,
    ) -> None:
        self.components = components  # (latent_channels, C*p*p), orthonormal rows
        self.mean = mean  # (C*p*p,): the mean patch, removed before projecting
        self.config = config
        self.in_channels = in_channels

    @classmethod
    def fit(
        cls,
        images: np.ndarray,
        patch_size: int = 8,
        latent_channels: int = 4,
        shift: bool = False,
    ) -> PatchPCAAutoencoder:
        """PCA of every training patch; ``scaling_factor`` = 1 / std of the latents.

        ``shift=True`` also records the latents' mean as ``shift_factor`` (SD3 / Flux
        style, ``(z - shift_factor) * scaling_factor``); SD 1.x uses only the scale.
        """
        _, c, h, w = images.shape
        if h % patch_size or w % patch_size:
            raise ValueError(f"image size {h}x{w} is not divisible by patch_size {patch_size}")
        # --8<-- [start:fit]
        rows = patchify(images, patch_size).reshape(-1, c * patch_size**2)  # (B*h*w, C*p*p)
        mean = rows.mean(axis=0)
        # principal directions: the top eigenvectors of the (C*p*p, C*p*p) patch covariance
        centred = rows - mean
        eigenvalues, eigenvectors = np.linalg.eigh(centred.T @ centred / len(rows))
        order = np.argsort(eigenvalues)[::-1][:latent_channels]  # largest variance first
        components = eigenvectors[:, order].T  # (latent_channels, C*p*p), orthonormal rows
        # fix each direction's sign (eigh may return either) so runs are reproducible
        components *= np.sign(components[np.arange(latent_channels), np.abs(components).argmax(1)])[
            :, None
        ]
        latents = (rows - mean) @ components.T
        shift_factor = float(latents.mean()) if shift else 0.0
        scaling_factor = float(1.0 / (latents - shift_factor).std())
        config = VAEConfig(patch_size, latent_channels, scaling_factor, shift_factor)
        # --8<-- [end:fit]
        return cls(components, mean, config, in_channels=c)

    # --8<-- [start:encode_decode]
    def encode(self, images: np.ndarray) -> np.ndarray:
        """``(B, C, H, W)`` pixels -> ``(B, latent_channels, H/p, W/p)`` latents (unscaled)."""
        p = self.config.patch_size
        patches = patchify(images, p) - self.mean  # (B, h, w, C*p*p)
        return (patches @ self.components.T).transpose(0, 3, 1, 2)  # channels to axis 1

    def decode(self, latents: np.ndarray) -> np.ndarray:
        """``(B, latent_channels, h, w)`` latents (unscaled) -> ``(B, C, h*p, w*p)`` pixels."""
        patches = latents.transpose(0, 2, 3, 1) @ self.components + self.mean
        return unpatchify(patches, self.in_channels, self.config.patch_size)

    # --8<-- [end:encode_decode]
