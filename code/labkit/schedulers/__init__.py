"""NumPy schedulers with diffusers' public contract, taught in lab 03.

Each class mirrors the diffusers scheduler of the same name (checked against the installed
diffusers by ``tests/verify/test_schedulers_vs_diffusers.py``): the same constructor
keywords and defaults, ``set_timesteps``, ``timesteps``, ``init_noise_sigma``,
``scale_model_input`` and ``step(...).prev_sample``, so a NumPy loop reads like a pipeline's:

    scheduler.set_timesteps(num_inference_steps)
    latents = noise * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        latent_model_input = scheduler.scale_model_input(latents, t)
        noise_pred = denoiser(latent_model_input, t)
        latents = scheduler.step(noise_pred, t, latents).prev_sample

- ``DDPMScheduler``: ancestral sampling (arXiv:2006.11239)
- ``DDIMScheduler``: deterministic jumps, ``eta`` for noise (arXiv:2010.02502)
- ``EulerDiscreteScheduler``: Euler on the sigma ODE, optional Karras sigmas (arXiv:2206.00364)
- ``FlowMatchEulerDiscreteScheduler``: rectified flow, SD3's sampler (arXiv:2403.03206)

Each file reads top to bottom on its own; arrays are float64 NumPy.
"""

from labkit.schedulers.ddim import DDIMScheduler
from labkit.schedulers.ddpm import DDPMScheduler
from labkit.schedulers.euler import EulerDiscreteScheduler
from labkit.schedulers.flow_match import FlowMatchEulerDiscreteScheduler
from labkit.schedulers.output import SchedulerOutput

__all__ = [
    "DDIMScheduler",
    "DDPMScheduler",
    "EulerDiscreteScheduler",
    "FlowMatchEulerDiscreteScheduler",
    "SchedulerOutput",
]
