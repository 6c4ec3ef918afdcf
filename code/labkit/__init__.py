"""labkit: the shared scaffolding of the InfraLens labs.

Only what several labs need lives here, and only after a lab has taught it:

- ``labkit.schedules``: the DDPM noise schedules (``betas``, ``alphas_cumprod``),
  with diffusers' ``beta_schedule`` names and formulas.
- ``labkit.data``: a 2-D Gaussian mixture, the toy data set whose exact denoiser
  is known in closed form.
- ``labkit.denoiser``: that exact denoiser, returning ``epsilon``, ``sample`` or
  ``v_prediction`` outputs like a trained network would.
- ``labkit.cli``: argument parsing that gives one-line errors and ignores a
  notebook kernel's own argv.

NumPy is the only dependency.
"""

from labkit.data import GaussianMixture, default_mixture
from labkit.denoiser import ExactDenoiser, FlowMatchDenoiser
from labkit.schedules import BETA_SCHEDULES, alphas_cumprod, canonical_betas, make_betas

__all__ = [
    "BETA_SCHEDULES",
    "ExactDenoiser",
    "FlowMatchDenoiser",
    "GaussianMixture",
    "alphas_cumprod",
    "canonical_betas",
    "default_mixture",
    "make_betas",
]
