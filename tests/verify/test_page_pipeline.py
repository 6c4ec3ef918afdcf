"""Handbook "Diffusers pipeline anatomy" against the real DiffusionPipeline machinery.

Tiny random-config components (``tiny.py``), saved and loaded from local temporary
folders; no weights, no hub. The page also lists the claims of Lab 06's module
(``test_page_lab_06.py``): the model_index.json contents, the four families' components,
scheduler swapping, the must-match boundaries and the shapes.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from tiny import (
    FLUX_VAE_FACTORS,
    HEIGHT,
    SD_BETAS,
    SD_SCHEDULER,
    WIDTH,
    dit_embeds,
    embeds,
    guider_swapped,
    leaf_block_calls,
    sdxl_modular_inputs,
    start_latents,
    tiny_flux_pipeline,
    tiny_modular_sdxl,
    tiny_sd3_pipeline_16ch,
    tiny_sd_pipeline,
    tiny_sdxl_pipeline,
    tiny_sdxl_unet,
    tiny_text_encoder,
    tiny_tokenizer,
)

from infralens_docs.registry import ROOT

pytestmark = pytest.mark.usefixtures("quiet_diffusers")


def once_per_entry_sentences(page: str) -> list[str]:
    """The sentences (or table cells) of a page that say the denoiser runs once per entry."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    found = []
    for line in text.splitlines():
        for part in re.split(r"(?<=[.!?])\s+|\s\|\s", line):
            if re.search(r"once per (entry|`scheduler\.timesteps` entry|scheduler timestep)", part):
                found.append(part)
    return found


@pytest.fixture
def pipe(tmp_path):
    return tiny_sd_pipeline(text_encoder=tiny_text_encoder(), tokenizer=tiny_tokenizer(tmp_path))


def test_register_modules_records_library_and_class_in_the_config(pipe):
    """`__init__` calls `register_modules`, which stores each component as an attribute and records a `(library, class)` pair for it in `pipe.config`: the dict `save_pretrained` writes as `model_index.json`."""
    assert pipe.config["unet"] == ("diffusers", "UNet2DConditionModel")
    assert pipe.config["text_encoder"] == ("transformers", "CLIPTextModel")
    assert pipe.config["safety_checker"] == (None, None)
    assert pipe.unet is pipe.components["unet"]
    assert set(pipe.components) == {
        "vae", "text_encoder", "tokenizer", "unet", "scheduler", "safety_checker",
        "feature_extractor", "image_encoder",
    }  # fmt: skip


def test_assigning_a_component_updates_the_model_index(pipe, tmp_path):
    """Assigning `pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)` updates `pipe.config.scheduler`, so `save_pretrained` writes the new class into `model_index.json`."""
    from diffusers import EulerDiscreteScheduler

    pipe.scheduler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    assert pipe.config["scheduler"] == ("diffusers", "EulerDiscreteScheduler")
    pipe.save_pretrained(tmp_path / "saved")
    index = json.loads((tmp_path / "saved" / "model_index.json").read_text(encoding="utf-8"))
    assert index["scheduler"] == ["diffusers", "EulerDiscreteScheduler"]
    config = json.loads(
        (tmp_path / "saved" / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8")
    )
    assert config["_class_name"] == "EulerDiscreteScheduler"


def test_from_pretrained_takes_component_overrides(pipe, tmp_path):
    """`from_pretrained(folder, scheduler=...)` uses the component passed in instead of loading that subfolder; the other components still load from the folder."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline

    pipe.save_pretrained(tmp_path / "saved")
    euler = EulerDiscreteScheduler.from_config(pipe.scheduler.config)
    loaded = StableDiffusionPipeline.from_pretrained(tmp_path / "saved", scheduler=euler)
    assert loaded.scheduler is euler
    assert type(loaded.unet).__name__ == "UNet2DConditionModel"


def test_components_build_a_second_pipeline_sharing_the_modules(pipe):
    """`StableDiffusionImg2ImgPipeline(**pipe.components)` builds a second pipeline around the very same module objects: no weights are copied or reloaded."""
    from diffusers import StableDiffusionImg2ImgPipeline

    img2img = StableDiffusionImg2ImgPipeline(**pipe.components)
    assert img2img.unet is pipe.unet and img2img.vae is pipe.vae
    assert img2img.text_encoder is pipe.text_encoder


def test_to_dtype_casts_every_module_and_the_pipeline_runs(pipe):
    """In `StableDiffusionPipeline`, `pipe.to(torch.float64)` casts every `torch.nn.Module` component (UNet, VAE, text encoder); `pipe.dtype` follows, and `__call__` runs with `latents` in that dtype."""
    pipe.to(torch.float64)
    for module in (pipe.unet, pipe.vae, pipe.text_encoder):
        assert next(module.parameters()).dtype == torch.float64
    assert pipe.dtype == torch.float64 and pipe.device == torch.device("cpu")
    out = pipe(
        prompt_embeds=embeds(1).double(), num_inference_steps=2, guidance_scale=1.0,
        height=HEIGHT, width=WIDTH, latents=start_latents().double(), output_type="latent",
    ).images  # fmt: skip
    assert out.dtype == torch.float64


@pytest.mark.parametrize(
    "cls_name, sequence",
    [
        ("StableDiffusionPipeline", "text_encoder->image_encoder->unet->vae"),
        ("StableDiffusionXLPipeline", "text_encoder->text_encoder_2->image_encoder->unet->vae"),
        (
            "StableDiffusion3Pipeline",
            "text_encoder->text_encoder_2->text_encoder_3->image_encoder->transformer->vae",
        ),
        ("FluxPipeline", "text_encoder->text_encoder_2->image_encoder->transformer->vae"),
    ],
)
def test_model_cpu_offload_seq_lists_encoders_denoiser_vae(cls_name, sequence):
    """Each of the four pipeline classes declares `model_cpu_offload_seq`: its text encoders, then `image_encoder`, then the denoiser, then the VAE (for SD 1.5 `text_encoder->image_encoder->unet->vae`, for Flux `text_encoder->text_encoder_2->image_encoder->transformer->vae`)."""
    import diffusers

    assert getattr(diffusers, cls_name).model_cpu_offload_seq == sequence


def test_a_call_uses_its_models_in_the_offload_order(pipe):
    """A `StableDiffusionPipeline` call runs its models in the order of `model_cpu_offload_seq`: the text encoder, then the UNet at every step, then the VAE once."""
    order = []
    hooks = [
        getattr(pipe, name).register_forward_pre_hook(lambda m, a, name=name: order.append(name))
        for name in ("text_encoder", "unet")
    ]
    decode = pipe.vae.decode
    pipe.vae.decode = lambda *a, **k: order.append("vae") or decode(*a, **k)
    try:
        pipe(prompt="a cat", num_inference_steps=2, guidance_scale=1.0, height=HEIGHT,
             width=WIDTH, output_type="np")  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    assert order == ["text_encoder", "unet", "unet", "vae"]
    present = [n for n in pipe.model_cpu_offload_seq.split("->") if getattr(pipe, n) is not None]
    assert present == ["text_encoder", "unet", "vae"]


def test_one_vae_decode_per_call_whatever_the_batch(record_calls):
    """The decoder runs once per call, not once per image: given two prompts' embeddings (`B` = 2), `StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` each call `vae.decode` once, on both rows, and the VAE's decoder runs one forward pass."""
    from diffusers import EulerDiscreteScheduler

    euler = EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)
    text, pooled = torch.cat([embeds(1), embeds(2)]), torch.randn(2, 20)
    (t1, p1), (t2, p2) = dit_embeds(1), dit_embeds(2)
    dit = dict(prompt_embeds=torch.cat([t1, t2]), pooled_prompt_embeds=torch.cat([p1, p2]))
    cases = [
        (tiny_sd_pipeline(), dict(prompt_embeds=text)),
        (tiny_sdxl_pipeline(euler, unet=tiny_sdxl_unet(pooled=20), add_watermarker=False),
         dict(prompt_embeds=text, pooled_prompt_embeds=pooled)),
        (tiny_sd3_pipeline_16ch(), dit),
        (tiny_flux_pipeline(vae_seed=0, vae_config=FLUX_VAE_FACTORS), dit),
    ]  # fmt: skip
    for pipe, kwargs in cases:
        name, decode, rows = type(pipe).__name__, pipe.vae.decode, []
        pipe.vae.decode = lambda z, *a, d=decode, r=rows, **k: r.append(z.shape[0]) or d(z, *a, **k)
        forwards = record_calls(pipe.vae.decoder).calls
        with torch.no_grad():
            images = pipe(**kwargs, guidance_scale=1.0, num_inference_steps=1, height=HEIGHT,
                          width=WIDTH, output_type="np").images  # fmt: skip
        assert len(images) == 2 and rows == [2] and len(forwards) == 1, (name, rows)


def test_text_to_image_calls_the_denoiser_once_per_timestep_at_default_settings(record_calls):
    """In text-to-image at default settings (each pipeline's own `guidance_scale`), `StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` call the denoiser `len(scheduler.timesteps)` times and `vae.decode` at most once: not at all with `output_type="latent"`. Not beyond that: `StableDiffusionImg2ImgPipeline` at `strength=0.5` runs the UNet on 2 of its 4 timesteps, and `StableDiffusion3Pipeline` with `skip_guidance_layers=[0]` (over the whole loop) makes 7 transformer calls at 4 steps."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler, StableDiffusionImg2ImgPipeline

    euler = EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)
    (t3, p3), (n3, np3) = dit_embeds(1), dit_embeds(2)
    sd3_kwargs = dict(prompt_embeds=t3, pooled_prompt_embeds=p3, negative_prompt_embeds=n3,
                      negative_pooled_prompt_embeds=np3)  # fmt: skip
    sd3 = tiny_sd3_pipeline_16ch()
    cases = [  # prompt_embeds (and the negative pair the default guidance needs), no guidance_scale
        (tiny_sd_pipeline(), dict(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2))),
        (tiny_sdxl_pipeline(euler, unet=tiny_sdxl_unet(pooled=20), add_watermarker=False),
         dict(prompt_embeds=embeds(1), pooled_prompt_embeds=torch.randn(1, 20))),
        (sd3, sd3_kwargs),
        (tiny_flux_pipeline(vae_seed=0, vae_config=FLUX_VAE_FACTORS), dict(prompt_embeds=t3, pooled_prompt_embeds=p3)),
    ]  # fmt: skip
    run = dict(num_inference_steps=3, height=HEIGHT, width=WIDTH, output_type="latent")
    for pipe, kwargs in cases:
        name, decode, decoded = type(pipe).__name__, pipe.vae.decode, []
        pipe.vae.decode = lambda *a, d=decode, r=decoded, **k: r.append(1) or d(*a, **k)
        calls = record_calls(pipe.unet if hasattr(pipe, "unet") else pipe.transformer).calls
        with torch.no_grad():
            pipe(**kwargs, **run)
        assert len(calls) == len(pipe.scheduler.timesteps) >= 3 and decoded == [], name
    ddim = DDIMScheduler(**SD_SCHEDULER)
    img2img = StableDiffusionImg2ImgPipeline(**tiny_sd_pipeline(ddim).components)
    img2img.set_progress_bar_config(disable=True)
    calls = record_calls(img2img.unet).calls
    with torch.no_grad():
        img2img(prompt_embeds=embeds(1), image=torch.rand(1, 3, HEIGHT, WIDTH), strength=0.5,
                num_inference_steps=4, guidance_scale=1.0, output_type="latent")  # fmt: skip
    assert (len(calls), len(img2img.scheduler.timesteps)) == (2, 4)
    calls = record_calls(sd3.transformer).calls
    with torch.no_grad():
        sd3(**sd3_kwargs, **{**run, "num_inference_steps": 4}, skip_guidance_layers=[0],
            skip_layer_guidance_start=0.0, skip_layer_guidance_stop=1.0)  # fmt: skip
    assert (len(calls), len(sd3.scheduler.timesteps)) == (7, 4)


def test_two_calls_with_the_same_inputs_give_the_same_result(pipe):
    """In `StableDiffusionPipeline`, two calls with the same `latents` and `prompt_embeds` give identical results."""
    kwargs = dict(prompt_embeds=embeds(1), num_inference_steps=3, guidance_scale=3.0,
                  height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    first = pipe(latents=start_latents(), **kwargs).images
    second = pipe(latents=start_latents(), **kwargs).images
    assert torch.equal(first, second)


def test_a_wrong_scaling_factor_decodes_without_an_error(pipe):
    """In `StableDiffusionPipeline`, a VAE whose `scaling_factor` differs from the one the denoiser was trained with decodes without an error: `vae.decode` receives `latents` at a different scale and returns a different image."""
    kwargs = dict(prompt_embeds=embeds(1), num_inference_steps=2, guidance_scale=1.0,
                  height=HEIGHT, width=WIDTH, output_type="np")  # fmt: skip
    right = pipe(latents=start_latents(), **kwargs).images
    pipe.vae.register_to_config(scaling_factor=1.0)
    wrong = pipe(latents=start_latents(), **kwargs).images
    assert right.shape == wrong.shape and not (right == wrong).all()


def test_sd3_and_flux_decode_a_wrong_shift_but_raise_without_one(record_calls):
    """A wrong `shift_factor` value raises nothing either: `StableDiffusion3Pipeline` and `FluxPipeline` decode it to a different image. But SD3 and Flux raise `TypeError` after the loop if the VAE's `shift_factor` is `None` (`AutoencoderKL`'s default): every step runs, then `latents / scaling_factor + shift_factor` fails before `vae.decode` is entered."""
    text, pooled = dit_embeds(1)
    run = dict(prompt_embeds=text, pooled_prompt_embeds=pooled, guidance_scale=1.0,
               num_inference_steps=2, height=HEIGHT, width=WIDTH, output_type="np")  # fmt: skip
    for pipe in (tiny_sd3_pipeline_16ch(), tiny_flux_pipeline(vae_config=FLUX_VAE_FACTORS)):
        name, shift = type(pipe).__name__, pipe.vae.config.shift_factor
        with torch.no_grad():
            right = pipe(**run, generator=torch.Generator().manual_seed(0)).images
            pipe.vae.register_to_config(shift_factor=shift + 0.5)
            wrong = pipe(**run, generator=torch.Generator().manual_seed(0)).images
        assert right.shape == wrong.shape and not (right == wrong).all(), name
        pipe.vae.register_to_config(shift_factor=None)
        steps, decoded = record_calls(pipe.transformer).calls, record_calls(pipe.vae.decoder).calls
        with pytest.raises(TypeError), torch.no_grad():
            pipe(**run, generator=torch.Generator().manual_seed(0))
        assert len(steps) == 2 and decoded == [], name


def test_prompt_embeds_can_be_passed_instead_of_a_prompt(record_calls):
    """`StableDiffusionPipeline`, `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` built without text encoders run `__call__` from `prompt_embeds` (plus `pooled_prompt_embeds` from SDXL on, and the negative pair when CFG is on), so the text encoders need not be present during the loop; with classifier-free guidance on (`guidance_scale` 3.0, UNets without `time_cond_proj_dim`), SD 1.5's, SDXL's and SD3's denoisers get `2B` rows, negative first, and Flux.1-dev's `B`."""
    from diffusers import EulerDiscreteScheduler

    euler = EulerDiscreteScheduler(**SD_BETAS, steps_offset=1)
    sdxl = tiny_sdxl_pipeline(euler, unet=tiny_sdxl_unet(pooled=20), add_watermarker=False)
    (text, neg), (pooled, neg_pooled) = (embeds(1), embeds(2)), torch.randn(2, 1, 20).unbind()
    (t3, p3), (n3, np3) = dit_embeds(1), dit_embeds(2)
    cases = [  # (pipeline, kwargs, text rows the denoiser must receive)
        (tiny_sd_pipeline(), dict(prompt_embeds=text, negative_prompt_embeds=neg),
         torch.cat([neg, text])),
        (sdxl, dict(prompt_embeds=text, negative_prompt_embeds=neg, pooled_prompt_embeds=pooled,
                    negative_pooled_prompt_embeds=neg_pooled), torch.cat([neg, text])),
        (tiny_sd3_pipeline_16ch(), dict(prompt_embeds=t3, negative_prompt_embeds=n3,
                                   pooled_prompt_embeds=p3, negative_pooled_prompt_embeds=np3),
         torch.cat([n3, t3])),
        (tiny_flux_pipeline(vae_seed=0, vae_config=FLUX_VAE_FACTORS), dict(prompt_embeds=t3, pooled_prompt_embeds=p3), t3),
    ]  # fmt: skip
    for pipe, kwargs, rows in cases:
        encoders = [v for k, v in pipe.components.items() if k.startswith("text_encoder")]
        assert encoders and all(e is None for e in encoders), type(pipe).__name__
        denoiser = pipe.unet if hasattr(pipe, "unet") else pipe.transformer
        assert denoiser.config.get("time_cond_proj_dim") is None, type(pipe).__name__
        calls = record_calls(denoiser).calls
        with torch.no_grad():
            pipe(**kwargs, guidance_scale=3.0, num_inference_steps=2, height=HEIGHT,
                 width=WIDTH, output_type="latent")  # fmt: skip
        assert len(calls) == 2, type(pipe).__name__
        torch.testing.assert_close(calls[0][1]["encoder_hidden_states"], rows)


def test_from_pipe_shares_the_loaded_modules(pipe):
    """`StableDiffusionImg2ImgPipeline.from_pipe(pipe)` builds a second pipeline around the same objects (the same `id` for `unet`, `vae`, `text_encoder`, `tokenizer` and even `scheduler`), so no weights are loaded or copied; a component passed by keyword (`scheduler=...`) replaces it in the new pipeline only, and changing a shared module (casting the UNet) changes it in both; `from_pipe` ends with `.to(dtype)`, float32 by default, so on a float16 pipeline without `dtype=torch.float16` it casts the original's modules to float32 too."""
    from diffusers import DDIMScheduler, StableDiffusionImg2ImgPipeline

    second = StableDiffusionImg2ImgPipeline.from_pipe(pipe)
    for name in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert id(getattr(second, name)) == id(getattr(pipe, name))
    ddim = DDIMScheduler.from_config(pipe.scheduler.config)
    third = StableDiffusionImg2ImgPipeline.from_pipe(pipe, scheduler=ddim)
    assert third.scheduler is ddim and pipe.scheduler is not ddim and third.unet is pipe.unet
    second.unet.to(torch.float64)
    assert pipe.unet.dtype == torch.float64
    pipe.to(torch.float16)
    StableDiffusionImg2ImgPipeline.from_pipe(pipe, dtype=torch.float16)
    assert pipe.unet.dtype == pipe.vae.dtype == torch.float16
    StableDiffusionImg2ImgPipeline.from_pipe(pipe)  # no dtype: float32
    assert pipe.unet.dtype == pipe.vae.dtype == torch.float32


def test_resolution_rules_differ_by_pipeline():
    """`StableDiffusionPipeline.check_inputs` raises `ValueError` unless height and width are divisible by 8; `StableDiffusion3Pipeline` raises unless they are divisible by `vae_scale_factor * patch_size` (16 for SD3's VAE and patch 2); `FluxPipeline` only logs a warning for sizes not divisible by `vae_scale_factor * 2` and rounds the latent grid down."""
    from tiny import (
        DIT_TEXT,
        DIT_TOKENS,
        embeds,
        logged_messages,
        tiny_flux_pipeline,
        tiny_sd3_pipeline,
    )

    sd = tiny_sd_pipeline()
    with pytest.raises(ValueError, match="divisible by 8"):
        sd(prompt_embeds=embeds(0), height=20, width=16, num_inference_steps=1)
    sd3 = tiny_sd3_pipeline()  # tiny VAE: vae_scale_factor 2, patch 2: multiples of 4
    step = sd3.vae_scale_factor * sd3.patch_size
    assert step == 4
    with pytest.raises(ValueError, match=f"divisible by {step}"):
        sd3(prompt_embeds=torch.randn(1, 5, 32), pooled_prompt_embeds=torch.randn(1, 16),
            height=18, width=16, num_inference_steps=1)  # fmt: skip
    flux = tiny_flux_pipeline()
    with logged_messages() as messages, torch.no_grad():
        out = flux(prompt_embeds=torch.randn(1, DIT_TOKENS, DIT_TEXT),
                   pooled_prompt_embeds=torch.randn(1, DIT_TEXT), height=18, width=16,
                   num_inference_steps=1, output_type="latent").images  # fmt: skip
    assert any("divisible by 4" in m for m in messages)
    assert out.shape == (1, 4 * 4, 64)  # 18 px rounds down to a 4-patch side, as 16 px


def test_the_loop_calls_the_denoiser_once_per_scheduler_timestep(record_calls):
    """The loop runs the denoiser and `scheduler.step` over `scheduler.timesteps` (SD 1.5's PNDM: 51 entries at 50 steps), not always `num_inference_steps` times: `StableDiffusionPipeline` with SD 1.5's shipped `PNDMScheduler` (`skip_prk_steps=True`) makes 3 UNet calls at 2 steps but 1 at 1 step, while an `EulerDiscreteScheduler` built by `from_config` on that config (`linspace` spacing) makes 3 at 3. Calls per entry are not fixed: at 1000 steps that `PNDMScheduler` puts `t = 1000` first, and the pipeline makes one UNet call, then raises an `IndexError`; `FluxPipeline` (guidance-embedded, FLUX.1-dev's shape) with `true_cfg_scale=2` and a negative prompt makes two transformer calls per step, each on `B` rows.

    So the page's loop stage gives no per-entry count (it is at "default settings" further
    down), its Flux clause says `B` rows, not one call per step, and the interview answer's
    SD 1.5 count ("once per scheduler timestep") says "below 1000 steps".
    """
    from diffusers import EulerDiscreteScheduler, PNDMScheduler

    pndm = PNDMScheduler(**SD_BETAS, steps_offset=1, set_alpha_to_one=False, skip_prk_steps=True)
    euler = EulerDiscreteScheduler.from_config(pndm.config)
    assert euler.config.timestep_spacing == "linspace"
    pipe = tiny_sd_pipeline(pndm)
    calls = record_calls(pipe.unet).calls
    for scheduler, steps, expected in ((pndm, 1, 1), (pndm, 2, 3), (euler, 3, 3)):
        pipe.scheduler = scheduler
        calls.clear()
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), num_inference_steps=steps, guidance_scale=1.0,
                 height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
        assert len(calls) == expected == len(pipe.scheduler.timesteps), (type(scheduler).__name__, steps)  # fmt: skip
    pipe.scheduler = PNDMScheduler.from_config(pndm.config)
    calls.clear()
    with torch.no_grad(), pytest.raises(IndexError):
        pipe(prompt_embeds=embeds(1), num_inference_steps=1000, guidance_scale=1.0,
             height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    assert int(pipe.scheduler.timesteps[0]) == 1000 and len(pipe.scheduler.timesteps) == 1001
    assert len(calls) == 1
    pndm.set_timesteps(50)
    assert len(pndm.timesteps) == 51
    flux = tiny_flux_pipeline()
    flux_calls = record_calls(flux.transformer).calls
    (text, pooled), (negative, negative_pooled) = dit_embeds(1), dit_embeds(2)
    with torch.no_grad():
        flux(prompt_embeds=text, pooled_prompt_embeds=pooled, negative_prompt_embeds=negative,
             negative_pooled_prompt_embeds=negative_pooled, true_cfg_scale=2.0, num_inference_steps=2,
             height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    assert len(flux.scheduler.timesteps) == 2 and len(flux_calls) == 4
    assert all(k["hidden_states"].shape[0] == 1 for _, k in flux_calls)  # B rows per call
    counts = once_per_entry_sentences("handbook/pipeline.md")  # the interview answer's SD 1.5 count
    assert len(counts) == 1 and "below 1000 steps" in counts[0].lower(), counts
    page = (ROOT / "docs" / "handbook" / "pipeline.md").read_text(encoding="utf-8")
    stage = [line for line in page.splitlines() if "**The loop updates latents**" in line]
    assert len(stage) == 1 and "Flux.1-dev embeds" in stage[0], stage
    assert "one call per step" not in stage[0], stage


def test_from_pretrained_loads_mismatched_components_without_an_error(tmp_path):
    """`__init__` and `from_pretrained` compare none of these: a `StableDiffusionPipeline` folder with a 16-channel VAE against a 4-channel UNet and a 48-wide text encoder against `cross_attention_dim` 32, and a `StableDiffusionXLPipeline` folder whose `text_encoder_2` projects to 16 against a UNet built for a 20-wide pooled vector, are built, saved and loaded back without an error, every mismatch intact; the UNet's config has no `prediction_type` to compare."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline
    from tiny import tiny_vae

    tok = tiny_tokenizer(tmp_path)
    sd = tiny_sd_pipeline(vae=tiny_vae(latent_channels=16), tokenizer=tok,
                          text_encoder=tiny_text_encoder(hidden_size=48))  # fmt: skip
    xl = StableDiffusionXLPipeline(**{
        **tiny_sdxl_pipeline(unet=tiny_sdxl_unet(pooled=20)).components,
        "text_encoder": tiny_text_encoder(16), "tokenizer": tok, "tokenizer_2": tok,
        "text_encoder_2": tiny_text_encoder(16, seed=1, with_projection=True, projection_dim=16),
    })  # fmt: skip
    sd.save_pretrained(tmp_path / "sd")
    xl.save_pretrained(tmp_path / "xl")
    sd = StableDiffusionPipeline.from_pretrained(tmp_path / "sd")
    xl = StableDiffusionXLPipeline.from_pretrained(tmp_path / "xl")
    assert (sd.vae.config.latent_channels, sd.unet.config.in_channels) == (16, 4)
    assert (sd.text_encoder.config.hidden_size, sd.unet.config.cross_attention_dim) == (48, 32)
    unet = xl.unet.config
    pooled = unet.projection_class_embeddings_input_dim - 6 * unet.addition_time_embed_dim
    assert (xl.text_encoder_2.config.projection_dim, pooled) == (16, 20)
    assert "prediction_type" not in sd.unet.config


@pytest.fixture(scope="module")
def with_encoders(tmp_path_factory):
    """Tiny SD 1.5, SDXL, SD3 and Flux pipelines with real (tiny) text encoders."""
    from tiny import text_to_image_pipelines

    return text_to_image_pipelines(tmp_path_factory.mktemp("tokenizer"))


def test_text_encoders_run_once_or_twice_per_call(with_encoders):
    """With each pipeline's default `guidance_scale`, `pipe(prompt)` runs `FluxPipeline`'s CLIP and T5 once per call (Flux.1-dev: one guidance-embedded call per step) and `StableDiffusionXLPipeline`'s two encoders once (`force_zeros_for_empty_prompt` zeroes the missing negative prompt), while `StableDiffusionPipeline` and `StableDiffusion3Pipeline` run every text encoder, T5 included, twice: for the prompt and for the empty negative prompt."""
    expected = {"SD 1.5": 2, "SDXL": 1, "SD3 Medium": 2, "Flux.1-dev": 1}
    for family, runs in expected.items():
        pipe, kwargs = with_encoders[family]
        encoders = {n: m for n, m in pipe.components.items() if n.startswith("text_encoder") and m is not None}  # fmt: skip
        counts = dict.fromkeys(encoders, 0)
        hooks = [
            m.register_forward_pre_hook(lambda mod, a, n=n, c=counts: c.__setitem__(n, c[n] + 1))
            for n, m in encoders.items()
        ]
        try:
            with torch.no_grad():
                pipe("a cat", num_inference_steps=1, height=HEIGHT, width=WIDTH,
                     output_type="latent", **kwargs)  # fmt: skip
        finally:
            for hook in hooks:
                hook.remove()
        assert len(counts) == {"SD 1.5": 1, "SDXL": 2, "SD3 Medium": 3, "Flux.1-dev": 2}[family]
        assert set(counts.values()) == {runs}, (family, counts)


def test_prompt_embeds_alone_still_need_the_encoders_under_guidance():
    """With the text encoders removed, `prompt_embeds` alone are not enough: `StableDiffusionXLPipeline`, `StableDiffusion3Pipeline` and `FluxPipeline` raise `ValueError` without `pooled_prompt_embeds`; with guidance on, `StableDiffusionPipeline` and `StableDiffusion3Pipeline` (given the pooled vector) reach for their tokenizer and text encoders to encode the empty negative prompt and raise; the same calls run once `negative_prompt_embeds` (and SD3's `negative_pooled_prompt_embeds`) are passed. `StableDiffusionXLPipeline` runs guided without them only because `force_zeros_for_empty_prompt=True` (SDXL base's setting) zeroes them; set to `False`, it raises too."""
    sd, sd3 = tiny_sd_pipeline(), tiny_sd3_pipeline_16ch()
    flux = tiny_flux_pipeline(vae_seed=0, vae_config=FLUX_VAE_FACTORS)
    for pipe, text in ((tiny_sdxl_pipeline(), embeds(1)), (sd3, dit_embeds(1)[0]), (flux, dit_embeds(1)[0])):  # fmt: skip
        with pytest.raises(ValueError, match="pooled_prompt_embeds"), torch.no_grad():
            pipe(prompt_embeds=text, guidance_scale=1.0, num_inference_steps=1, height=HEIGHT,
                 width=WIDTH, output_type="latent")  # fmt: skip
    (t3, p3), (n3, np3) = dit_embeds(1), dit_embeds(2)
    cases = [
        (sd, dict(prompt_embeds=embeds(1)), dict(negative_prompt_embeds=embeds(2))),
        (sd3, dict(prompt_embeds=t3, pooled_prompt_embeds=p3),
         dict(negative_prompt_embeds=n3, negative_pooled_prompt_embeds=np3)),
    ]  # fmt: skip
    run = dict(guidance_scale=5.0, num_inference_steps=1, height=HEIGHT, width=WIDTH, output_type="latent")  # fmt: skip
    for pipe, given, negatives in cases:
        with pytest.raises((AttributeError, TypeError)), torch.no_grad():
            pipe(**given, **run)
        with torch.no_grad():
            pipe(**given, **negatives, **run)
    sdxl = tiny_sdxl_pipeline(unet=tiny_sdxl_unet(pooled=20), add_watermarker=False)
    assert sdxl.config.force_zeros_for_empty_prompt is True
    given = dict(prompt_embeds=embeds(1), pooled_prompt_embeds=torch.randn(1, 20))
    with torch.no_grad():
        sdxl(**given, **run)
    sdxl.register_to_config(force_zeros_for_empty_prompt=False)
    with pytest.raises(AttributeError), torch.no_grad():
        sdxl(**given, **run)


def test_optional_components_per_family(with_encoders, tmp_path, record_calls):
    """The optional components (`_optional_components`) are SD 1.5's `safety_checker`, `feature_extractor`, `image_encoder`; SDXL's `tokenizer`, `tokenizer_2`, `text_encoder`, `text_encoder_2`, `image_encoder`, `feature_extractor`; SD3's and Flux's `image_encoder`, `feature_extractor`. Optional means the folder may lack it: an SDXL pipeline saved without its text encoders loads them back as `None`, while an SD3 folder without them (`save_pretrained` writes `[null, null]` for them, required or not) loads only if they are passed as `None`. Any component passed as `None` is not loaded: `StableDiffusion3Pipeline.from_pretrained(folder, text_encoder_3=None, tokenizer_3=None)` drops T5, and `pipe(prompt)` then runs with zeros in place of T5's tokens."""
    import diffusers
    from tiny import tiny_sd3_pipeline

    expected = {
        "StableDiffusionPipeline": {"safety_checker", "feature_extractor", "image_encoder"},
        "StableDiffusionXLPipeline": {"tokenizer", "tokenizer_2", "text_encoder", "text_encoder_2",
                                      "image_encoder", "feature_extractor"},
        "StableDiffusion3Pipeline": {"image_encoder", "feature_extractor"},
        "FluxPipeline": {"image_encoder", "feature_extractor"},
    }  # fmt: skip
    for name, optional in expected.items():
        assert set(getattr(diffusers, name)._optional_components) == optional, name
    tiny_sdxl_pipeline().save_pretrained(tmp_path / "sdxl")
    loaded = diffusers.StableDiffusionXLPipeline.from_pretrained(tmp_path / "sdxl")
    assert loaded.text_encoder is None and loaded.text_encoder_2 is None
    tiny_sd3_pipeline().save_pretrained(tmp_path / "sd3-bare")
    index = json.loads((tmp_path / "sd3-bare" / "model_index.json").read_text(encoding="utf-8"))
    assert index["text_encoder_3"] == index["tokenizer_3"] == [None, None]  # required, yet null
    with pytest.raises(ValueError, match="expected"):
        diffusers.StableDiffusion3Pipeline.from_pretrained(tmp_path / "sd3-bare")
    none = {f"{kind}{s}": None for kind in ("text_encoder", "tokenizer") for s in ("", "_2", "_3")}
    assert diffusers.StableDiffusion3Pipeline.from_pretrained(tmp_path / "sd3-bare", **none).text_encoder_3 is None  # fmt: skip
    sd3, kwargs = with_encoders["SD3 Medium"]
    sd3.save_pretrained(tmp_path / "sd3")
    no_t5 = diffusers.StableDiffusion3Pipeline.from_pretrained(tmp_path / "sd3", text_encoder_3=None, tokenizer_3=None)  # fmt: skip
    assert no_t5.text_encoder_3 is None and no_t5.text_encoder is not None
    no_t5.set_progress_bar_config(disable=True)
    calls = record_calls(no_t5.transformer).calls
    with torch.no_grad():
        no_t5("a cat", guidance_scale=1.0, num_inference_steps=1, height=HEIGHT, width=WIDTH,
              output_type="latent", **kwargs)  # fmt: skip
    text = calls[0][1]["encoder_hidden_states"]
    t5_tokens = kwargs["max_sequence_length"]
    assert text.shape[1] == 77 + t5_tokens and (text[:, 77:] == 0).all() and text[:, :77].abs().sum() > 0  # fmt: skip


def test_float16_loading_keeps_t5s_wo_in_float32(with_encoders, tmp_path):
    """`FluxPipeline.from_pretrained(folder, dtype=torch.float16)` loads the transformer, the VAE and CLIP in float16, but not every weight: T5's feed-forward output layers (`wo`, transformers' `_keep_in_fp32_modules`) stay float32, in Flux's `text_encoder_2` as in `StableDiffusion3Pipeline`'s `text_encoder_3`."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline

    for family, cls, denoiser, t5_name in (
        ("Flux.1-dev", FluxPipeline, "transformer", "text_encoder_2"),
        ("SD3 Medium", StableDiffusion3Pipeline, "transformer", "text_encoder_3"),
    ):
        pipe, _ = with_encoders[family]
        pipe.save_pretrained(tmp_path / family)
        loaded = cls.from_pretrained(tmp_path / family, dtype=torch.float16)
        for module in (getattr(loaded, denoiser), loaded.vae, loaded.text_encoder):
            assert {p.dtype for p in module.parameters()} == {torch.float16}, family
        t5 = {name: p.dtype for name, p in getattr(loaded, t5_name).named_parameters()}
        assert {d for n, d in t5.items() if n.endswith("wo.weight")} == {torch.float32}, family
        assert {d for n, d in t5.items() if n.endswith("wi.weight")} == {torch.float16}, family


def test_flow_match_from_config_keeps_every_init_key_it_shares():
    """`FlowMatchEulerDiscreteScheduler.from_config` keeps every `__init__` key it shares with the old class that the old file set, not only the sigma-spacing flags: from a `DPMSolverMultistepScheduler` config with `use_dynamic_shifting=True` it keeps dynamic shifting, and its `set_timesteps(4)` then raises `ValueError` without `mu`."""
    import inspect

    from diffusers import DPMSolverMultistepScheduler, FlowMatchEulerDiscreteScheduler

    def init_keys(cls):
        return set(inspect.signature(cls.__init__).parameters) - {"self"}

    shared = init_keys(FlowMatchEulerDiscreteScheduler) & init_keys(DPMSolverMultistepScheduler)
    set_to = {"num_train_timesteps": 500, "time_shift_type": "linear", "use_beta_sigmas": True,
              "use_dynamic_shifting": True, "use_exponential_sigmas": True,
              "use_karras_sigmas": True}  # fmt: skip
    assert shared == set(set_to)  # a new shared key fails here until it is carried below
    for key, value in set_to.items():  # one at a time: the sigma flags exclude each other
        carried = FlowMatchEulerDiscreteScheduler.from_config(DPMSolverMultistepScheduler(**{key: value}).config)  # fmt: skip
        assert carried.config[key] == value, key
    old = DPMSolverMultistepScheduler(use_dynamic_shifting=True, time_shift_type="linear")
    flow = FlowMatchEulerDiscreteScheduler.from_config(old.config)
    assert flow.config.use_dynamic_shifting is True and flow.config.time_shift_type == "linear"
    with pytest.raises(ValueError, match="mu"):
        flow.set_timesteps(4)
    flow.set_timesteps(4, mu=0.5)


# ---------------------------------------------------------------- modular pipelines


@pytest.fixture(scope="module")
def modular_sdxl(tmp_path_factory):
    """(modular, classic): SDXL's modular pipeline over the tiny SDXL parts, built once."""
    return tiny_modular_sdxl(tmp_path_factory.mktemp("tiny-sdxl"))


def test_sdxl_modular_blocks_write_only_declared_state_keys(modular_sdxl, monkeypatch):
    """A modular pipeline (`diffusers.modular_pipelines`) runs the same stages as blocks; with the text-encoder block removed and with the prompt embeddings passed in, each block of SDXL's text-to-image call (the denoise loop counted as one) writes only `PipelineState` keys it declares as inputs or outputs.

    The call takes prompt embeddings (``sdxl_modular_blocks`` drops the text-encoder,
    IP-Adapter and VAE-encoder blocks); its branch is text-to-image (the loop block is
    ``StableDiffusionXLDenoiseStep``). Every block class of the tree that receives the
    ``PipelineState`` has its ``__call__`` wrapped, and ``state.values`` is diffed around it,
    so a write by any route (``set_block_state`` or ``state.set``) counts. Other branches
    (ControlNet, inpainting) are not run.
    """
    from diffusers.modular_pipelines import PipelineState

    pipe, _ = modular_sdxl
    seen, in_loop = [], set()

    def tree(block):
        for sub in block.sub_blocks.values():
            yield sub
            yield from tree(sub)

    def spied(original):
        def spy(self, components, state, *args, **kwargs):
            if not isinstance(state, PipelineState):  # a loop sub-block: it gets the block state
                in_loop.add(type(self).__name__)
                return original(self, components, state, *args, **kwargs)
            before = dict(state.values)
            out = original(self, components, state, *args, **kwargs)
            changed = {k for k, v in state.values.items() if k not in before or before[k] is not v}
            seen.append((type(self).__name__, changed, set(self.intermediate_output_names) | set(self.input_names)))  # fmt: skip
            return out

        return spy

    for cls in {type(b) for b in [pipe.blocks, *tree(pipe.blocks)]}:
        monkeypatch.setattr(cls, "__call__", spied(cls.__call__))
    state = pipe(**sdxl_modular_inputs())
    assert isinstance(state, PipelineState)
    assert {"timesteps", "latents", "images"} <= set(state.values)
    leaves = {"StableDiffusionXLInputStep", "StableDiffusionXLSetTimestepsStep",
              "StableDiffusionXLPrepareLatentsStep", "StableDiffusionXLPrepareAdditionalConditioningStep",
              "StableDiffusionXLDenoiseStep", "StableDiffusionXLDecodeStep"}  # fmt: skip
    assert leaves <= {name for name, changed, _ in seen if changed}  # text-to-image, each wrote
    for name, changed, declared in seen:
        assert changed <= declared, (name, changed - declared)
    # the prompt embeddings are passed in: no text-encoder block runs
    assert not any("TextEncoder" in type(b).__name__ for b in tree(pipe.blocks))
    # the denoise loop counts as one block: its sub-blocks get a block state, and what the
    # denoiser sub-block computes (`noise_pred`) never reaches the PipelineState
    assert {"StableDiffusionXLLoopBeforeDenoiser", "StableDiffusionXLLoopDenoiser", "StableDiffusionXLLoopAfterDenoiser"} <= in_loop  # fmt: skip
    assert "noise_pred" not in state.values


def test_flux3_ships_only_as_a_modular_pipeline():
    """In diffusers 0.42.1 FLUX.3 ships only this way: `Flux3ModularPipeline` and `Flux3DistilledModularPipeline`, no classic `Flux3Pipeline`."""
    import importlib.util

    import diffusers

    exported = {name for names in diffusers._import_structure.values() for name in names}
    flux3 = sorted(n for n in exported if n.startswith("Flux3") and n.endswith("Pipeline"))
    assert flux3 == ["Flux3DistilledModularPipeline", "Flux3ModularPipeline"], flux3
    assert not hasattr(diffusers, "Flux3Pipeline")
    assert importlib.util.find_spec("diffusers.pipelines.flux3") is None
    assert importlib.util.find_spec("diffusers.modular_pipelines.flux3") is not None


def test_sdxl_modular_guidance_is_the_guider_component(modular_sdxl):
    """In SDXL's modular pipeline, guidance is a component: its blocks take no `guidance_scale` (passed one, the call warns and ignores it); the `guider` (`ClassifierFreeGuidance`, at 7.5 unless set) holds it, and `update_components(guider=...)` replaces it, with APG (`AdaptiveProjectedGuidance`) or PAG (`PerturbedAttentionGuidance`), say, while the same blocks run."""
    import numpy as np
    from diffusers import ClassifierFreeGuidance
    from diffusers.guiders import AdaptiveProjectedGuidance, PerturbedAttentionGuidance
    from diffusers.hooks import LayerSkipConfig

    pipe, _ = modular_sdxl
    assert "guidance_scale" not in pipe.blocks.input_names
    assert type(pipe.guider) is ClassifierFreeGuidance and pipe.guider.guidance_scale == 7.5
    names, before = leaf_block_calls(pipe, **sdxl_modular_inputs(), output="images")
    with pytest.warns(UserWarning, match="guidance_scale"):
        ignored = pipe(**sdxl_modular_inputs(), guidance_scale=1.0, output="images")
    np.testing.assert_array_equal(ignored, before)
    unet, vae, scheduler = pipe.unet, pipe.vae, pipe.scheduler
    fqn = next(n for n, _ in pipe.unet.named_modules() if n.endswith("transformer_blocks"))
    layer = LayerSkipConfig(indices=[0], fqn=fqn, skip_attention=False, skip_attention_scores=True)
    for guider in (
        ClassifierFreeGuidance(guidance_scale=1.5),
        AdaptiveProjectedGuidance(guidance_scale=7.5, eta=0.0),
        PerturbedAttentionGuidance(perturbed_guidance_config=layer, perturbed_guidance_stop=1.0),
    ):
        with guider_swapped(pipe, guider):
            assert pipe.guider is guider
            assert (pipe.unet, pipe.vae, pipe.scheduler) == (unet, vae, scheduler)
            names_after, after = leaf_block_calls(pipe, **sdxl_modular_inputs(), output="images")
        assert names_after == names and len(names) > 4, type(guider).__name__
        assert np.abs(after - before).max() > 1e-3, type(guider).__name__
