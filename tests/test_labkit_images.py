"""labkit.images and labkit.vae: the toy images, their exact denoiser and the patch-PCA VAE."""

from __future__ import annotations

import numpy as np
import pytest

from labkit import ExactDenoiser, alphas_cumprod, canonical_betas
from labkit.denoiser import UNCOND
from labkit.images import SHAPES, FiniteSet, image_grid, toy_images
from labkit.vae import PatchPCAAutoencoder, patchify, unpatchify


@pytest.fixture(scope="module")
def data():
    return toy_images(256, seed=0)


def test_toy_images_are_deterministic_and_in_range(data):
    again = toy_images(256, seed=0)
    np.testing.assert_array_equal(data.images, again.images)
    assert data.images.shape == (256, 3, 32, 32) and data.images.dtype == np.float64
    assert data.images.min() >= -1.0 and data.images.max() <= 1.0
    assert set(data.labels.tolist()) == set(range(len(SHAPES)))
    assert not np.array_equal(data.images, toy_images(256, seed=1).images)


def test_shapes_differ_where_they_should():
    """A disc and a square of the same size and place differ only in the corners."""
    d = toy_images(400, seed=3)
    # every image has some foreground: at least 40 pixels away from the background value
    foreground = np.abs(d.images - d.images[:, :, :1, :1]).max(axis=1) > 0.5
    assert foreground.reshape(len(d.images), -1).sum(axis=1).min() >= 20


def test_finite_set_posterior_mean_is_the_softmax_average(data):
    fs = FiniteSet(data.images[:20], data.labels[:20])
    rng = np.random.default_rng(0)
    alpha, sigma = 0.6, 0.8
    x_t = alpha * data.images[:5] + sigma * rng.standard_normal((5, 3, 32, 32))
    # brute force: log-weights from squared distances
    d2 = ((x_t[:, None] - alpha * fs.points[None]) ** 2).reshape(5, 20, -1).sum(-1)
    w = np.exp(-(d2 - d2.min(1, keepdims=True)) / (2 * sigma**2))
    w /= w.sum(1, keepdims=True)
    expected = np.einsum("nk,kchw->nchw", w, fs.points)
    np.testing.assert_allclose(fs.posterior_mean(x_t, alpha, sigma), expected, atol=1e-10)


def test_finite_set_limits(data):
    """Low noise: the nearest training image. Huge noise: the set's mean."""
    fs = FiniteSet(data.images[:30], data.labels[:30])
    x = 0.999 * data.images[7:8]
    np.testing.assert_allclose(fs.posterior_mean(x, 0.999, 0.01), data.images[7:8], atol=1e-8)
    far = fs.posterior_mean(np.zeros((1, 3, 32, 32)), 1e-3, 100.0)
    np.testing.assert_allclose(far[0], fs.points.mean(axis=0), atol=1e-3)


def test_exact_denoiser_conditions_on_image_classes(data):
    fs = FiniteSet(data.images, data.labels)
    unet = ExactDenoiser(fs, alphas_cumprod(canonical_betas("scaled_linear")), "sample")
    x = data.images[:4] * 0.1  # arbitrary noisy input
    labels = np.array([0, 1, UNCOND, 3])
    out = unet(x, 200, class_labels=labels)
    assert out.shape == x.shape
    # each conditioned row is a convex combination of that class's images only
    for row, label in [(0, 0), (1, 1), (3, 3)]:
        part = fs.restrict(label)
        ab = unet.alpha_bar_at(200)
        w = part.weights(x[row : row + 1], np.sqrt(ab), np.sqrt(1 - ab))
        np.testing.assert_allclose(
            out[row], (w @ part.points.reshape(len(part.points), -1)).reshape(3, 32, 32)
        )


def test_nearest_finds_training_images(data):
    fs = FiniteSet(data.images, data.labels)
    idx, rms = fs.nearest(data.images[[5, 9]])
    assert idx.tolist() == [5, 9] and rms.max() < 1e-6


def test_patchify_round_trip(data):
    x = data.images[:3]
    patches = patchify(x, 8)
    assert patches.shape == (3, 4, 4, 192)
    np.testing.assert_array_equal(unpatchify(patches, 3, 8), x)
    # one patch row is exactly the 8 x 8 block of all three channels
    np.testing.assert_array_equal(patches[1, 2, 3], x[1, :, 16:24, 24:32].reshape(-1))


def test_patch_pca_autoencoder(data):
    vae = PatchPCAAutoencoder.fit(data.images)
    z = vae.encode(data.images)
    assert z.shape == (256, 4, 4, 4)
    np.testing.assert_allclose(vae.components @ vae.components.T, np.eye(4), atol=1e-10)
    assert (z * vae.config.scaling_factor).std() == pytest.approx(1.0)
    recon = vae.decode(z)
    assert recon.shape == data.images.shape
    # more channels keep more: the error falls as latent_channels grows
    errors = []
    for c in (1, 4, 16):
        v = PatchPCAAutoencoder.fit(data.images, latent_channels=c)
        errors.append(np.sqrt(((v.decode(v.encode(data.images)) - data.images) ** 2).mean()))
    assert errors[0] > errors[1] > errors[2]
    # decoding is exact for an image made of principal components
    z2 = np.random.default_rng(0).standard_normal((2, 4, 4, 4))
    np.testing.assert_allclose(vae.encode(vae.decode(z2)), z2, atol=1e-10)


def test_patch_pca_rejects_sizes_it_cannot_tile(data):
    with pytest.raises(ValueError, match="not divisible"):
        PatchPCAAutoencoder.fit(data.images[:, :, :30, :30])


def test_shift_factor_centres_the_latents(data):
    vae = PatchPCAAutoencoder.fit(data.images, shift=True)
    z = vae.encode(data.images)
    scaled = (z - vae.config.shift_factor) * vae.config.scaling_factor
    assert scaled.mean() == pytest.approx(0.0, abs=1e-9) and scaled.std() == pytest.approx(1.0)


def test_image_grid_layout(data):
    grid = image_grid(data.images[:10], columns=4)
    assert grid.shape == (3 * 33 + 1, 4 * 33 + 1, 3) and grid.dtype == np.uint8
