"""Lab 23 (Modular Diffusers) against the real SDXL modular pipeline.

No weights, no hub: the tiny random SDXL parts of ``tiny.py`` (a "text_time" UNet, a
two-block VAE, Euler with SD's betas) are saved with the classic
``StableDiffusionXLPipeline.save_pretrained`` into a temporary folder, and the modular
pipeline is built from SDXL's own blocks with ``init_pipeline(that folder)`` and
``load_components``, as a reader would from a hub repository. The text-encoder,
IP-Adapter and VAE-encoder blocks are removed (``sub_blocks.pop``, as diffusers' own
modular tests do) and the prompt embeddings are passed in, so no tokenizer or text
encoder is needed. Spies wrap each block class's ``__call__`` in the tree and record the
state after it, and a forward pre-hook on the UNet records each call's batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import (
    HEIGHT,
    POOLED_DIM,
    WIDTH,
    embeds,
    sdxl_modular_blocks,
    sdxl_modular_inputs,
    tiny_sdxl_pipeline,
)

B, N, GUIDANCE = 1, 3, 5.0
#: the SDXL blocks a text-to-image call runs, in order, the loop's three per step
TOP = ["StableDiffusionXLInputStep", "StableDiffusionXLSetTimestepsStep",
       "StableDiffusionXLPrepareLatentsStep", "StableDiffusionXLPrepareAdditionalConditioningStep"]  # fmt: skip
LOOP = ["StableDiffusionXLLoopBeforeDenoiser", "StableDiffusionXLLoopDenoiser",
        "StableDiffusionXLLoopAfterDenoiser"]  # fmt: skip
ORDER = TOP + ["StableDiffusionXLDenoiseStep"] + LOOP * N + ["StableDiffusionXLDecodeStep"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(folder, classic pipeline): the tiny SDXL parts saved as a classic pipeline."""
    classic = tiny_sdxl_pipeline()
    folder = tmp_path_factory.mktemp("tiny-sdxl")
    classic.save_pretrained(folder)
    return str(folder), classic


def modular(folder, manager=None):
    """A modular SDXL pipeline over ``folder``, every component loaded."""
    pipe = sdxl_modular_blocks().init_pipeline(folder, components_manager=manager)
    pipe.load_components()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def walk(block):
    """Every block in the tree under ``block``."""
    for sub in getattr(block, "sub_blocks", {}).values():
        yield sub
        yield from walk(sub)


def spied_call(pipe, monkeypatch, **kwargs):
    """Run the modular ``pipe``; return (images, calls, auto): one ``(class, state before it,
    state after it)`` per leaf-block call (the loop's sub-blocks: the loop's block state), and
    one ``(class, leaf calls it made)`` per conditional (auto) block call."""
    from diffusers.modular_pipelines import ConditionalPipelineBlocks

    calls, auto = [], []

    def values(state):
        return dict(getattr(state, "values", None) or vars(state))

    for block in {type(b): b for b in walk(pipe.blocks)}.values():
        original = type(block).__call__
        if isinstance(block, ConditionalPipelineBlocks):

            def spy(self, components, state, *args, _original=original, **kw):
                first = len(calls)
                out = _original(self, components, state, *args, **kw)
                auto.append((type(self).__name__, len(calls) - first))
                return out

        elif (
            getattr(block, "sub_blocks", None)
            and type(block).__name__ != "StableDiffusionXLDenoiseStep"
        ):
            continue  # sequential blocks: their leaves are recorded
        else:

            def spy(self, components, state, *args, _original=original, **kw):
                before = values(state)
                out = _original(self, components, state, *args, **kw)
                calls.append((type(self).__name__, before, values(out[1])))
                return out

        monkeypatch.setattr(type(block), "__call__", spy)
    images = pipe(**sdxl_modular_inputs(), **kwargs, output="images")
    return images, calls, auto


def unet_batches(unet, monkeypatch):
    """The batch of every UNet call, in order (a forward pre-hook)."""
    batches = []
    handle = unet.register_forward_pre_hook(lambda m, args: batches.append(args[0].shape[0]))
    return batches, handle


@pytest.fixture(scope="module")
def cfg_run(saved):
    """(images, calls, unet batches, auto) of one spied guided call of the modular pipeline."""
    folder, _ = saved
    pipe = modular(folder)
    mp = pytest.MonkeyPatch()
    batches, handle = unet_batches(pipe.unet, mp)
    try:
        images, calls, auto = spied_call(pipe, mp)
    finally:
        handle.remove()
        mp.undo()
    return images, calls, batches, auto


def test_text_to_image_block_order(cfg_run):
    """With the text-encoder block removed and the prompt embeddings passed in, SDXL's blocks run in this order: `input`, `set_timesteps`, `prepare_latents`, `prepare_add_cond`, then the denoise loop, whose `before_denoiser`, `denoiser` and `after_denoiser` run once per Euler step, then `decode`."""
    _, calls, _, _ = cfg_run
    names = [name for name, *_ in calls]
    loop_ends = [k for k, name in enumerate(names) if name == "StableDiffusionXLDenoiseStep"]
    assert len(loop_ends) == 1
    # the loop wrapper's spy fires when it returns: after its sub-blocks ran
    loop = names.pop(loop_ends[0])
    names.insert(len(TOP), loop)
    assert names == ORDER


def test_state_keys_written_at_each_boundary(cfg_run):
    """With the text-encoder block removed and the prompt embeddings passed in, each block of SDXL's text-to-image call writes into the state only keys it declares (`set_block_state`, `modular_pipeline.py:619`): its `intermediate_outputs`, and the inputs whose value it replaced (SDXL's `prepare_add_cond` writes back `original_size` and `target_size`, which the call left at `None`). `set_timesteps` writes `timesteps`, `prepare_latents` writes `latents`, the loop writes `latents` back, `decode` writes `images`."""
    images, calls, _, _ = cfg_run
    blocks = {type(b).__name__: b for b in walk(sdxl_modular_blocks())}
    wrote = {}
    for name, before, after in calls:  # the state before and after each block, the first too
        if name in LOOP:  # the loop's sub-blocks work on the loop's own block state
            continue
        changed = {k for k, v in after.items() if k not in before or before[k] is not v}
        declared = set(blocks[name].intermediate_output_names)
        assert changed <= declared | set(blocks[name].input_names), (name, changed)
        wrote[name] = changed
    assert set(wrote) == set(TOP) | {"StableDiffusionXLDenoiseStep", "StableDiffusionXLDecodeStep"}
    replaced = {n: c - set(blocks[n].intermediate_output_names) for n, c in wrote.items()}
    assert {k: v for k, v in replaced.items() if v} == {
        "StableDiffusionXLPrepareAdditionalConditioningStep": {"original_size", "target_size"}
    }
    assert "timesteps" in wrote["StableDiffusionXLSetTimestepsStep"]
    for name in ("StableDiffusionXLPrepareLatentsStep", "StableDiffusionXLDenoiseStep"):
        assert "latents" in wrote[name], name
    assert "images" in wrote["StableDiffusionXLDecodeStep"]
    after = {name: values for name, _, values in calls}
    assert tuple(after["StableDiffusionXLSetTimestepsStep"]["timesteps"].shape) == (N,)
    latents = after["StableDiffusionXLPrepareLatentsStep"]["latents"]
    assert tuple(latents.shape) == (B, 4, HEIGHT // 2, WIDTH // 2)  # the tiny VAE's factor 2
    assert images.shape == (B, HEIGHT, WIDTH, 3)


def test_unet_runs_once_per_guider_batch(saved, cfg_run, monkeypatch):
    """With `ClassifierFreeGuidance` at its default 7.5, Euler and a UNet without `time_cond_proj_dim`, SDXL's `denoiser` block calls the UNet twice per step, once per guider batch of `B` rows; the classic `StableDiffusionXLPipeline` calls it once per step on the doubled batch of `2B`."""
    from diffusers import EulerDiscreteScheduler

    _, _, batches, _ = cfg_run
    folder, _ = saved
    pipe = modular(folder)
    assert pipe.unet.config.time_cond_proj_dim is None
    assert isinstance(pipe.scheduler, EulerDiscreteScheduler) and pipe.guider.guidance_scale == 7.5
    assert batches == [B] * (2 * N)
    _, classic = saved
    classic_batches, handle = unet_batches(classic.unet, monkeypatch)
    try:
        classic(**sdxl_modular_inputs(), guidance_scale=GUIDANCE)
    finally:
        handle.remove()
    assert classic_batches == [2 * B] * N


@pytest.mark.parametrize(
    "scale, per_step, original", [(1.0, 1, False), (0.5, 2, False), (1.0, 2, True)]
)
def test_cfg_batches_at_scale_one_and_below(saved, monkeypatch, scale, per_step, original):
    """With Euler, a UNet without `time_cond_proj_dim` and its other settings at their defaults, `ClassifierFreeGuidance` at `guidance_scale` 1 makes one batch, so SDXL's `denoiser` block calls the UNet once per step; at 0.5 it still makes two, where the classic `StableDiffusionXLPipeline` runs one batch at both; with `use_original_formulation=True` it makes two at 1."""
    from diffusers import ClassifierFreeGuidance, EulerDiscreteScheduler

    folder, classic = saved
    pipe = modular(folder)
    assert isinstance(pipe.scheduler, EulerDiscreteScheduler)
    assert pipe.unet.config.time_cond_proj_dim is None
    guider = ClassifierFreeGuidance(guidance_scale=scale, use_original_formulation=original)
    pipe.update_components(guider=guider)
    batches, handle = unet_batches(pipe.unet, monkeypatch)
    try:
        pipe(**sdxl_modular_inputs(), output="images")
    finally:
        handle.remove()
    assert batches == [B] * (per_step * N)
    classic_batches, handle = unet_batches(classic.unet, monkeypatch)
    try:
        classic(**sdxl_modular_inputs(), guidance_scale=scale)
    finally:
        handle.remove()
    assert classic_batches == [B] * N


def test_missing_required_input_is_an_error(saved):
    """A block's `get_block_state` raises on a missing required input: SDXL's blocks without their text-encoder block, called without `prompt_embeds`, fail with "Required input 'prompt_embeds' is missing"."""
    folder, _ = saved
    pipe = modular(folder)
    kwargs = sdxl_modular_inputs()
    del kwargs["prompt_embeds"]
    with pytest.raises(ValueError, match="Required input 'prompt_embeds' is missing"):
        pipe(**kwargs, output="images")


def test_flux3_ships_only_as_modular_pipelines():
    """In diffusers 0.42.1 FLUX.3 ships only as modular pipelines, `Flux3ModularPipeline` and `Flux3DistilledModularPipeline` (no classic `Flux3Pipeline`); neither one's blocks take a `guidance_scale` input, and only `Flux3ModularPipeline`'s expect a `guider` component (the distilled one has none)."""
    import diffusers

    exported = {name for names in diffusers._import_structure.values() for name in names}
    flux3 = sorted(n for n in exported if n.startswith("Flux3") and n.endswith("Pipeline"))
    assert flux3 == ["Flux3DistilledModularPipeline", "Flux3ModularPipeline"], flux3
    guided = []
    for name in flux3:  # each pipeline's own default blocks
        blocks = getattr(diffusers, getattr(diffusers, name).default_blocks_name)()
        assert "guidance_scale" not in blocks.input_names, name
        if "guider" in [spec.name for spec in blocks.expected_components]:
            guided.append(name)
    assert guided == ["Flux3ModularPipeline"]


def test_modular_output_equals_classic(saved):
    """Built from the same tiny components with Euler, for one prompt, with the same seed and the same `guidance_scale` above 1 (tested at 1.5 and 5), the modular SDXL pipeline's images equal `StableDiffusionXLPipeline`'s up to float rounding, not bit for bit: the two batch the UNet differently. With Heun they differ beyond rounding, and so they do for two different prompts at `num_images_per_prompt=2`: the modular input step repeats `pooled_prompt_embeds` in another order. Left at their defaults they differ: the classic call's `guidance_scale` is 5, the guider's 7.5."""
    from diffusers import ClassifierFreeGuidance, EulerDiscreteScheduler, HeunDiscreteScheduler

    folder, classic = saved
    pipe = modular(folder)
    assert isinstance(pipe.scheduler, EulerDiscreteScheduler)
    assert isinstance(classic.scheduler, EulerDiscreteScheduler)
    default = pipe(**sdxl_modular_inputs(), output="images")  # the guider as init_pipeline built it
    classic_default = classic(**sdxl_modular_inputs()).images
    np.testing.assert_array_equal(
        classic_default, classic(**sdxl_modular_inputs(), guidance_scale=5.0).images
    )
    assert np.abs(default - classic_default).max() > 1e-3
    np.testing.assert_allclose(default, classic(**sdxl_modular_inputs(), guidance_scale=7.5).images, atol=1e-5, rtol=0)  # fmt: skip
    for scale in (1.5, GUIDANCE):
        pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=scale))
        images = pipe(**sdxl_modular_inputs(), output="images")
        reference = classic(**sdxl_modular_inputs(), guidance_scale=scale).images
        assert images.shape == reference.shape
        np.testing.assert_allclose(images, reference, atol=1e-5, rtol=0)
    assert not np.array_equal(images, reference)
    # two prompts, two images each (scale 5): beyond rounding, the pooled rows come in another order
    prompts, pooled = embeds(3, batch=2), torch.randn(2, POOLED_DIM, generator=torch.Generator().manual_seed(4))  # fmt: skip
    two = {**sdxl_modular_inputs(), "prompt_embeds": prompts, "pooled_prompt_embeds": pooled,
           "negative_prompt_embeds": torch.zeros_like(prompts), "negative_pooled_prompt_embeds": torch.zeros_like(pooled),
           "num_images_per_prompt": 2}  # fmt: skip
    assert not torch.equal(prompts[0], prompts[1])  # two different prompts
    assert not torch.equal(pooled[0], pooled[1])
    two_images = pipe(**two, output="images")
    two_reference = classic(**{**two, "generator": torch.Generator().manual_seed(0)}, guidance_scale=GUIDANCE).images  # fmt: skip
    assert two_images.shape == two_reference.shape == (4, HEIGHT, WIDTH, 3)
    assert np.abs(two_images - two_reference).max() > 1e-3
    pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=0.5))  # below 1: not equal
    assert np.abs(pipe(**sdxl_modular_inputs(), output="images") - classic(**sdxl_modular_inputs(), guidance_scale=0.5).images).max() > 1e-3  # fmt: skip
    # the cause: the tiny UNet's rows for one batch of 2 are not bit-identical to two of 1
    latents = torch.randn(1, 4, HEIGHT // 2, WIDTH // 2, generator=torch.Generator().manual_seed(0))
    cond, uncond = (
        sdxl_modular_inputs()["prompt_embeds"],
        sdxl_modular_inputs()["negative_prompt_embeds"],
    )
    pooled = sdxl_modular_inputs()["pooled_prompt_embeds"]
    time_ids = torch.tensor([[HEIGHT, WIDTH, 0, 0, HEIGHT, WIDTH]], dtype=torch.float32)
    added = {"text_embeds": torch.cat([pooled, pooled]), "time_ids": torch.cat([time_ids] * 2)}
    with torch.no_grad():
        both = classic.unet(torch.cat([latents] * 2), 500, torch.cat([uncond, cond]), added_cond_kwargs=added).sample  # fmt: skip
        one = classic.unet(latents, 500, uncond, added_cond_kwargs={k: v[:1] for k, v in added.items()}).sample  # fmt: skip
    torch.testing.assert_close(both[:1], one, atol=1e-5, rtol=0)
    assert not torch.equal(both[:1], one)
    other = classic(**sdxl_modular_inputs(), guidance_scale=1.0).images  # the check can fail
    assert np.abs(other - reference).max() > 1e-3
    # a second-order scheduler: not equal up to rounding at the same guidance_scale
    heun = HeunDiscreteScheduler.from_config(classic.scheduler.config)
    classic_heun = type(classic)(**{**classic.components, "scheduler": heun})
    classic_heun.set_progress_bar_config(disable=True)
    pipe.update_components(
        guider=ClassifierFreeGuidance(guidance_scale=GUIDANCE),
        scheduler=HeunDiscreteScheduler.from_config(classic.scheduler.config),
    )
    modular_batches, handle = unet_batches(pipe.unet, None)
    try:
        heun_images = pipe(**sdxl_modular_inputs(), output="images")
    finally:
        handle.remove()
    classic_batches, handle = unet_batches(classic_heun.unet, None)
    try:
        classic_heun_images = classic_heun(**sdxl_modular_inputs(), guidance_scale=GUIDANCE).images
    finally:
        handle.remove()
    assert np.abs(heun_images - classic_heun_images).max() > 1e-4
    # not the classic call cut into blocks: the classic one guides all 2N - 1 UNet calls, the
    # guider, told step i of N (denoise.py:227), guides only the first N (two batches each)
    assert classic_batches == [2 * B] * (2 * N - 1)
    assert modular_batches == [B] * (2 * N + N - 1)


def test_guidance_scale_belongs_to_the_guider(saved):
    """`guidance_scale` is not an input of SDXL's modular call: it is a setting of the `guider` component (`ClassifierFreeGuidance` at 7.5 unless set), and passing it to the call only warns that it is ignored."""
    folder, _ = saved
    pipe = modular(folder)
    assert "guidance_scale" not in pipe.blocks.input_names
    assert type(pipe.guider).__name__ == "ClassifierFreeGuidance"
    assert pipe.guider.guidance_scale == 7.5
    with pytest.warns(UserWarning, match="Unexpected input"):
        ignored = pipe(**sdxl_modular_inputs(), guidance_scale=1.0, output="images")
    np.testing.assert_array_equal(ignored, pipe(**sdxl_modular_inputs(), output="images"))


def test_swapping_the_guider_changes_only_the_guider(saved, cfg_run, monkeypatch):
    """With Euler, `update_components(guider=AdaptiveProjectedGuidance(...))` in place of `ClassifierFreeGuidance` swaps the guider and no other component: the same blocks run in the same order, APG is called once per step, and the images change."""
    from diffusers import AdaptiveProjectedGuidance, EulerDiscreteScheduler

    folder, _ = saved
    cfg_images, cfg_calls, _, _ = cfg_run
    pipe = modular(folder)
    assert isinstance(pipe.scheduler, EulerDiscreteScheduler)
    others = {n: getattr(pipe, n) for n in pipe.component_names if n != "guider"}
    pipe.update_components(guider=AdaptiveProjectedGuidance(guidance_scale=GUIDANCE))
    assert all(getattr(pipe, n) is c for n, c in others.items()), others
    seen = []
    original = AdaptiveProjectedGuidance.__call__
    monkeypatch.setattr(
        AdaptiveProjectedGuidance, "__call__", lambda self, data: seen.append(len(data)) or original(self, data)
    )  # fmt: skip
    images, calls, _ = spied_call(pipe, monkeypatch)
    assert [n for n, *_ in calls] == [n for n, *_ in cfg_calls]
    assert seen == [2] * N  # called once per step, on the two batches
    assert np.abs(images - cfg_images).max() > 1e-3


def test_auto_blocks_pick_a_branch_from_the_inputs(saved, cfg_run, monkeypatch):
    """An `AutoPipelineBlocks` runs the first sub-block whose trigger input is present, else its default, or nothing when it has none: in the text-to-image call SDXL's auto blocks with a default run it (`StableDiffusionXLPrepareLatentsStep` in the text-to-image branch, `StableDiffusionXLDenoiseStep`, `StableDiffusionXLDecodeStep`), the ControlNet-input one, with no default, runs no block, and `get_execution_blocks(image_latents=...)` resolves the same tree to the image-to-image ones."""
    from diffusers.modular_pipelines import ConditionalPipelineBlocks

    _, calls, _, auto = cfg_run
    ran = {name for name, *_ in calls}
    assert {"StableDiffusionXLPrepareLatentsStep", "StableDiffusionXLDenoiseStep",
            "StableDiffusionXLDecodeStep"} <= ran  # fmt: skip
    conditional = [
        b for b in walk(sdxl_modular_blocks()) if isinstance(b, ConditionalPipelineBlocks)
    ]
    leaf_calls = dict(auto)  # every conditional block the call reached, and the leaf blocks it ran
    skipped = [type(b).__name__ for b in conditional if b.default_block_name is None]
    assert "StableDiffusionXLAutoControlNetInputStep" in skipped
    for b in conditional:
        name = type(b).__name__
        if name in leaf_calls:  # reached: no trigger present, so a default runs and none skips
            assert (leaf_calls[name] > 0) == (b.default_block_name is not None), name
    assert leaf_calls["StableDiffusionXLAutoControlNetInputStep"] == 0
    resolved = sdxl_modular_blocks().get_execution_blocks(prompt_embeds=True, image_latents=True)
    names = [type(b).__name__ for b in resolved.sub_blocks.values()]
    assert "StableDiffusionXLImg2ImgPrepareLatentsStep" in names
    assert "StableDiffusionXLPrepareLatentsStep" not in names
    # the first present trigger wins: `mask` comes before `image_latents`
    both = sdxl_modular_blocks().get_execution_blocks(
        prompt_embeds=True, mask=True, image_latents=True
    )
    assert "StableDiffusionXLInpaintPrepareLatentsStep" in [type(b).__name__ for b in both.sub_blocks.values()]  # fmt: skip
    # and in a call: the branch `before_denoise` runs, stopped as it starts
    from diffusers.modular_pipelines.stable_diffusion_xl import (
        modular_blocks_stable_diffusion_xl as m,
    )

    class PickedError(Exception):
        pass

    def stop(self, *args, **kwargs):
        raise PickedError(type(self).__name__)

    for branch in (
        "StableDiffusionXLInpaintBeforeDenoiseStep",
        "StableDiffusionXLImg2ImgBeforeDenoiseStep",
    ):
        monkeypatch.setattr(getattr(m, branch), "__call__", stop)
    pipe = modular(saved[0])
    image_latents = torch.zeros(B, 4, HEIGHT // 2, WIDTH // 2)
    for extra, picked in (({"mask": torch.ones(B, 1, HEIGHT, WIDTH)}, "Inpaint"), ({}, "Img2Img")):
        with pytest.raises(PickedError, match=f"StableDiffusionXL{picked}BeforeDenoiseStep"):
            pipe(**sdxl_modular_inputs(), image_latents=image_latents, **extra, output="images")


def test_components_load_lazily(saved):
    """`init_pipeline(folder)` registers every component the blocks expect but builds only those created from a config (for these blocks: the guider and two image processors); `load_components(["unet"])` loads the UNet alone, `load_components()` the rest the folder holds (`controlnet`, not in it, stays `None`), and a `ComponentsManager` passed in holds each component loaded."""
    from pathlib import Path

    from diffusers import ComponentsManager

    folder, _ = saved
    manager = ComponentsManager()
    pipe = sdxl_modular_blocks().init_pipeline(folder, components_manager=manager)
    specs = {name: pipe.get_component_spec(name) for name in pipe.component_names}
    from_config = {n for n, spec in specs.items() if spec.default_creation_method == "from_config"}
    assert set(pipe.component_names) - set(pipe.null_component_names) == from_config
    assert {"guider", "image_processor", "control_image_processor"} == from_config
    assert not manager.components
    pipe.load_components(["unet"])
    assert set(pipe.null_component_names) == set(specs) - from_config - {"unet"}
    assert [manager._id_to_name(i) for i in manager.components] == ["unet"]
    assert manager.get_one(name="unet") is pipe.unet
    pipe.load_components()
    absent = {n for n in set(specs) - from_config if not (Path(folder) / n).is_dir()}
    assert absent == {"controlnet"}
    assert set(pipe.null_component_names) == absent
    assert sorted(manager._id_to_name(i) for i in manager.components) == [
        "scheduler",
        "unet",
        "vae",
    ]
