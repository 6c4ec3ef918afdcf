"""Lab 22 (guidance beyond CFG) against diffusers' own guiders and a modular SDXL pipeline.

Each NumPy function of the starter is fed the same tensors as the guider it is named after,
which runs its own path: ``set_state`` (the step), ``prepare_inputs`` (one batch per
prediction), then ``__call__`` on those batches with their ``noise_pred`` set, as a modular
denoise step does. The call counts come from SDXL's modular core denoise step built from
tiny random components (``tiny.py``), a forward pre-hook on the UNet counting calls.
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch
from tiny import HEIGHT, POOLED_DIM, SD_SCHEDULER, WIDTH, embeds, tiny_text_time_unet, tiny_vae

LAB22 = "code/lab-22-guidance-beyond-cfg/guiders.py"
PAGE = "docs/labs/lab-22-guidance-beyond-cfg.md"


@pytest.fixture(scope="module")
def starter():
    """The starter's globals after a short run (its functions are what the tests use)."""
    import runpy
    import sys

    from infralens_docs.registry import ROOT

    argv = ["guiders.py", "--guidance-scales", "2", "--num-samples", "100", "--steps", "2"]
    old, sys.argv = sys.argv, argv
    try:
        return runpy.run_path(str(ROOT / LAB22), run_name="__main__")
    finally:
        sys.argv = old


def predictions(seed=0, shape=(3, 4, 8, 8)):
    """pred_cond, pred_uncond, pred_cond_skip: float32, correlated like real branches."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g)
    return tuple(base + 0.3 * torch.randn(shape, generator=g) for _ in range(3))


def guide(guider, preds, step=2, steps=10):
    """One step of the guider's own path: set_state, prepare_inputs, __call__."""
    guider.set_state(step=step, num_inference_steps=steps, timestep=torch.tensor(500))
    fields = {"prompt_embeds": (torch.zeros(1), torch.ones(1))}
    batches = guider.prepare_inputs(fields)
    by_name = dict(zip(["pred_cond", "pred_uncond", "pred_cond_skip"], preds))  # noqa: B905 (fewer preds: two-prediction guiders)
    for batch in batches:
        name = getattr(batch, guider._identifier_key)
        batch.noise_pred = by_name["pred_cond_skip" if name == "pred_cond_seg" else name]
    return guider(batches).pred.double().numpy(), len(batches)


def np_(t):
    return t.double().numpy()


def test_each_rule_equals_its_guider(starter):
    """Each function of the starter equals the diffusers guider it is named after, fed the same tensors: `ClassifierFreeGuidance` (with `guidance_rescale` and `use_original_formulation`), `AdaptiveProjectedGuidance` (`eta`, the norm threshold, momentum over steps), `ClassifierFreeZeroStarGuidance` (the zeroed first step and the projected scale), `TangentialClassifierFreeGuidance`, and `PerturbedAttentionGuidance`, `SkipLayerGuidance` and `SmoothedEnergyGuidance`, whose combine line is one; each of them with `use_original_formulation=True` too."""
    from diffusers.guiders import (
        AdaptiveProjectedGuidance,
        ClassifierFreeGuidance,
        ClassifierFreeZeroStarGuidance,
        PerturbedAttentionGuidance,
        SkipLayerGuidance,
        SmoothedEnergyGuidance,
        TangentialClassifierFreeGuidance,
    )

    c, u, s = preds = predictions()
    C, U, S = np_(c), np_(u), np_(s)
    close = dict(rtol=1e-4, atol=1e-4)
    for kw in [dict(guidance_scale=5.0), dict(guidance_scale=5.0, guidance_rescale=0.7), dict(guidance_scale=5.0, use_original_formulation=True)]:  # fmt: skip
        pred, _ = guide(ClassifierFreeGuidance(**kw), preds[:2])
        np.testing.assert_allclose(pred, starter["ClassifierFreeGuidance"](C, U, **kw), **close)

    # a threshold of 3.0 binds: these pushes have norms near 7 (checked against no threshold)
    apg = AdaptiveProjectedGuidance(guidance_scale=5.0, eta=0.3, adaptive_projected_guidance_momentum=-0.5, adaptive_projected_guidance_rescale=3.0)  # fmt: skip
    uncapped = AdaptiveProjectedGuidance(guidance_scale=5.0, eta=0.3, adaptive_projected_guidance_momentum=-0.5, adaptive_projected_guidance_rescale=0.0)  # fmt: skip
    buffer = {"momentum": -0.5, "running_average": 0.0}
    for step in range(3):  # the momentum buffer carries over steps; it is reset at step 0
        c_k, u_k, _ = step_preds = predictions(seed=step)
        pred, _ = guide(apg, step_preds[:2], step=step)
        assert not np.allclose(pred, guide(uncapped, step_preds[:2], step=step)[0], **close)
        want = starter["AdaptiveProjectedGuidance"](np_(c_k), np_(u_k), 5.0, eta=0.3, norm_threshold=3.0, momentum_buffer=buffer)  # fmt: skip
        np.testing.assert_allclose(pred, want, **close)
    # at its defaults (eta=1.0, no momentum) and a push below the threshold, APG is CFG
    pred, _ = guide(AdaptiveProjectedGuidance(), preds[:2])
    np.testing.assert_allclose(pred, starter["ClassifierFreeGuidance"](C, U), **close)
    pred, _ = guide(AdaptiveProjectedGuidance(guidance_scale=5.0, eta=0.0), preds[:2])
    np.testing.assert_allclose(pred, starter["AdaptiveProjectedGuidance"](C, U, 5.0, eta=0.0), **close)  # fmt: skip
    assert not np.allclose(pred, starter["ClassifierFreeGuidance"](C, U, 5.0), **close)

    for step in (0, 2):
        pred, _ = guide(ClassifierFreeZeroStarGuidance(guidance_scale=5.0), preds[:2], step=step)
        want = starter["ClassifierFreeZeroStarGuidance"](C, U, step, 5.0)
        np.testing.assert_allclose(pred, want, **close)

    pred, _ = guide(TangentialClassifierFreeGuidance(guidance_scale=5.0), preds[:2])
    np.testing.assert_allclose(pred, starter["TangentialClassifierFreeGuidance"](C, U, 5.0), **close)  # fmt: skip

    from diffusers.guiders.smoothed_energy_guidance import SmoothedEnergyGuidanceConfig
    from diffusers.hooks import LayerSkipConfig

    family = [
        PerturbedAttentionGuidance(guidance_scale=5.0, perturbed_guidance_layers=[0]),
        SkipLayerGuidance(guidance_scale=5.0, skip_layer_guidance_layers=[0]),
        SmoothedEnergyGuidance(
            guidance_scale=5.0,
            seg_guidance_config=SmoothedEnergyGuidanceConfig(indices=[0], fqn="auto"),
        ),
    ]
    assert isinstance(family[1].skip_layer_config[0], LayerSkipConfig)
    # use_original_formulation=True: each class starts from pred_cond (CFG's is in the kw list above)
    original = dict(guidance_scale=5.0, use_original_formulation=True)
    twins = [
        (AdaptiveProjectedGuidance(eta=0.0, **original), starter["AdaptiveProjectedGuidance"](C, U, eta=0.0, **original), 2),
        (ClassifierFreeZeroStarGuidance(**original), starter["ClassifierFreeZeroStarGuidance"](C, U, 2, **original), 2),
        (TangentialClassifierFreeGuidance(**original), starter["TangentialClassifierFreeGuidance"](C, U, **original), 2),
        (PerturbedAttentionGuidance(perturbed_guidance_layers=[0], **original), starter["PerturbedAttentionGuidance"](C, U, S, **original), 3),
        (SkipLayerGuidance(skip_layer_guidance_layers=[0], **original), starter["PerturbedAttentionGuidance"](C, U, S, **original), 3),
        (SmoothedEnergyGuidance(seg_guidance_config=SmoothedEnergyGuidanceConfig(indices=[0], fqn="auto"), **original), starter["PerturbedAttentionGuidance"](C, U, S, **original), 3),
    ]  # fmt: skip
    for guider, want, n in twins:
        step = 1 if n == 3 else 2
        pred, _ = guide(guider, preds[:n], step=step)
        np.testing.assert_allclose(pred, want, **close)
        assert not np.allclose(pred, starter["ClassifierFreeGuidance"](C, U, 5.0), **close)
    for guider in family:  # step 1 of 10 is inside each one's window
        pred, n = guide(guider, preds, step=1)
        assert n == 3, type(guider).__name__
        np.testing.assert_allclose(pred, starter["PerturbedAttentionGuidance"](C, U, S, 5.0), **close)  # fmt: skip


def test_zero_star_zeroes_the_first_step_at_any_scale(starter):
    """`ClassifierFreeZeroStarGuidance`, at its default `guidance_rescale=0.0` and while enabled (after `disable()` it returns `pred_cond`, step 0 included), returns zeros for the first `zero_init_steps` steps (default 1; with 2, steps 0 and 1) even at `guidance_scale=1`, where `ClassifierFreeGuidance`, `AdaptiveProjectedGuidance` and `TangentialClassifierFreeGuidance` return `pred_cond` alone, from one prediction; with `use_original_formulation=True` the "off" point of these four is scale 0 instead of 1."""
    from diffusers.guiders import (
        AdaptiveProjectedGuidance,
        ClassifierFreeGuidance,
        ClassifierFreeZeroStarGuidance,
        TangentialClassifierFreeGuidance,
    )

    c, u, _ = predictions()
    assert ClassifierFreeZeroStarGuidance().zero_init_steps == 1
    pred, n = guide(ClassifierFreeZeroStarGuidance(guidance_scale=1.0), (c,), step=0)
    assert n == 1 and not pred.any()
    off = ClassifierFreeZeroStarGuidance(guidance_scale=5.0)
    off.disable()
    pred, n = guide(off, (c,), step=0)
    assert n == 1 and np.array_equal(pred, np_(c))
    two = ClassifierFreeZeroStarGuidance(guidance_scale=5.0, zero_init_steps=2)
    assert [guide(two, (c, u), step=i)[0].any() for i in range(3)] == [False, False, True]
    # with a rescale, the zeros go through rescale_noise_cfg (std 0) and come out NaN
    assert np.isnan(guide(ClassifierFreeZeroStarGuidance(guidance_scale=5.0, guidance_rescale=0.7), (c, u), step=0)[0]).all()  # fmt: skip
    for cls in (ClassifierFreeGuidance, AdaptiveProjectedGuidance, TangentialClassifierFreeGuidance, ClassifierFreeZeroStarGuidance):  # fmt: skip
        pred, n = guide(cls(guidance_scale=1.0), (c,), step=1)
        assert n == 1 and np.array_equal(pred, np_(c)), cls.__name__
        assert guide(cls(guidance_scale=1.0, use_original_formulation=True), (c, u), step=1)[1] == 2
        pred, n = guide(cls(guidance_scale=0.0, use_original_formulation=True), (c,), step=1)
        assert n == 1 and np.array_equal(pred, np_(c)), cls.__name__


def test_the_starter_counts_the_predictions_each_guider_asks_for(starter):
    """The starter's `sample` counts, per step, as many denoiser calls as `ClassifierFreeGuidance`, `AdaptiveProjectedGuidance`, `ClassifierFreeZeroStarGuidance` and `TangentialClassifierFreeGuidance` ask for predictions: one at `guidance_scale=1` and at `1 + 1e-10` (the guiders test the scale with `math.isclose`), two at 1.5."""
    from diffusers.guiders import (
        AdaptiveProjectedGuidance,
        ClassifierFreeGuidance,
        ClassifierFreeZeroStarGuidance,
        TangentialClassifierFreeGuidance,
    )

    rules = {
        ClassifierFreeGuidance: "CFG",
        AdaptiveProjectedGuidance: "APG, eta=0",
        ClassifierFreeZeroStarGuidance: "CFG-Zero*",
        TangentialClassifierFreeGuidance: "tangential CFG",
    }
    for cls, rule in rules.items():
        for scale, want in ((1.0, 1), (1 + 1e-10, 1), (1.5, 2)):
            asked = [guide(cls(guidance_scale=scale), predictions()[:want], step=i, steps=2)[1] for i in range(2)]  # fmt: skip
            assert asked == [want, want], (rule, scale)
            assert starter["sample"](rule, scale)[1] == want, (rule, scale)


def test_defaults_the_page_states():
    """The defaults the page states, read from each class's config (`PerturbedAttentionGuidance` needs its layers): `guidance_scale=7.5` for `ClassifierFreeGuidance`, `AdaptiveProjectedGuidance`, `ClassifierFreeZeroStarGuidance`, `TangentialClassifierFreeGuidance` and `PerturbedAttentionGuidance`; `AdaptiveProjectedGuidance`: `eta=1.0`, `adaptive_projected_guidance_rescale=15.0`, `adaptive_projected_guidance_momentum=None`; `PerturbedAttentionGuidance`: `perturbed_guidance_scale=2.8`, window 0.01 to 0.2."""
    from diffusers.guiders import (
        AdaptiveProjectedGuidance,
        ClassifierFreeGuidance,
        ClassifierFreeZeroStarGuidance,
        PerturbedAttentionGuidance,
        TangentialClassifierFreeGuidance,
    )

    for cls in (AdaptiveProjectedGuidance, ClassifierFreeGuidance, ClassifierFreeZeroStarGuidance, TangentialClassifierFreeGuidance):  # fmt: skip
        assert cls().config.guidance_scale == 7.5 and cls().config.guidance_rescale == 0.0
    apg = AdaptiveProjectedGuidance().config
    assert (apg.eta, apg.adaptive_projected_guidance_rescale, apg.adaptive_projected_guidance_momentum) == (1.0, 15.0, None)  # fmt: skip
    pag = PerturbedAttentionGuidance(perturbed_guidance_layers=[0]).config
    assert pag.guidance_scale == 7.5 and pag.perturbed_guidance_scale == 2.8
    assert (pag.perturbed_guidance_start, pag.perturbed_guidance_stop) == (0.01, 0.2)


def test_the_starters_perturbed_rule_has_the_window_of_the_guiders_it_names(starter):
    """The starter's `PAG/SLG` rule has the default window of `PerturbedAttentionGuidance` and `SkipLayerGuidance`: at 30 steps each asks for a third prediction on steps 1 to 5, where the starter's `perturbed_window` is open; `SmoothedEnergyGuidance`, whose combine line is theirs, defaults to the window 0.0 to 1.0: a third prediction on steps 1 to 29 of 30."""
    from diffusers.guiders import (
        PerturbedAttentionGuidance,
        SkipLayerGuidance,
        SmoothedEnergyGuidance,
    )
    from diffusers.guiders.smoothed_energy_guidance import SmoothedEnergyGuidanceConfig

    guiders = {
        "PAG": PerturbedAttentionGuidance(perturbed_guidance_layers=[0]),
        "SLG": SkipLayerGuidance(skip_layer_guidance_layers=[0]),
        "SEG": SmoothedEnergyGuidance(
            seg_guidance_config=SmoothedEnergyGuidanceConfig(indices=[0], fqn="auto")
        ),
    }

    def third_steps(guider, n=30):
        return [i for i in range(n) if guide(guider, predictions(), step=i, steps=n)[1] == 3]

    label = next(rule for rule in starter["RULES"] if rule.startswith("PAG"))
    window = [i for i in range(30) if starter["perturbed_window"](i, 30)]
    assert window == [1, 2, 3, 4, 5]
    for name in label.split("/"):
        assert third_steps(guiders[name]) == window, name
    assert third_steps(guiders["SEG"]) == list(range(1, 30))
    guiders["SEG"].set_state(step=1, num_inference_steps=30, timestep=torch.tensor(500))
    batches = guiders["SEG"].prepare_inputs({"prompt_embeds": (torch.zeros(1), torch.ones(1))})
    assert getattr(batches[2], guiders["SEG"]._identifier_key) == "pred_cond_seg"


def test_the_page_lists_every_guider_diffusers_ships():
    """The page's table of guiders is every `BaseGuidance` subclass `diffusers.guiders` exports, each with the length of its `_input_predictions`."""
    import diffusers.guiders as guiders
    from diffusers.guiders import BaseGuidance

    from infralens_docs.registry import ROOT

    shipped = {
        name: len(obj._input_predictions)
        for name, obj in vars(guiders).items()
        if inspect.isclass(obj) and issubclass(obj, BaseGuidance) and obj is not BaseGuidance
    }
    text = (ROOT / PAGE).read_text(encoding="utf-8")
    table = text.split("| class | predictions |")[1].split("\n\n")[0]
    listed = {m[0]: int(m[1]) for m in re.findall(r"\| `(\w+)` \| (\d+) \|", table)}
    assert listed == shipped


@pytest.fixture(scope="module")
def modular_sdxl():
    """SDXL's modular core denoise step (input, before_denoise, controlnet_input, denoise)
    around a tiny random text-time UNet and VAE, SD's Euler config unless another scheduler
    class is given; the UNet's calls counted, their outputs kept."""
    from diffusers import EulerDiscreteScheduler
    from diffusers.modular_pipelines.stable_diffusion_xl.modular_blocks_stable_diffusion_xl import (
        StableDiffusionXLCoreDenoiseStep,
    )

    pipe = StableDiffusionXLCoreDenoiseStep().init_pipeline()
    unet, lcm_unet = tiny_text_time_unet(), tiny_text_time_unet(time_cond_proj_dim=32)
    pipe.update_components(vae=tiny_vae(), unet=unet, scheduler=EulerDiscreteScheduler.from_config(SD_SCHEDULER))  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    calls, outputs = [], []
    for model in (unet, lcm_unet):
        model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs.get("encoder_hidden_states")), with_kwargs=True)  # fmt: skip
        model.register_forward_hook(lambda module, args, output: outputs.append(output[0]))
    pooled = torch.randn(1, POOLED_DIM, generator=torch.Generator().manual_seed(2))

    def run(guider, steps=10, lcm=False, scheduler=EulerDiscreteScheduler):
        pipe.update_components(guider=guider, unet=lcm_unet if lcm else unet, scheduler=scheduler.from_config(SD_SCHEDULER))  # fmt: skip
        calls.clear()
        outputs.clear()
        pipe(
            prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2),
            pooled_prompt_embeds=pooled, negative_pooled_prompt_embeds=torch.zeros_like(pooled),
            num_inference_steps=steps, height=HEIGHT, width=WIDTH,
            generator=torch.Generator().manual_seed(0), output="latents",
        )  # fmt: skip
        return list(calls)

    return unet, run, outputs


def test_modular_sdxl_calls_the_unet_once_per_prediction(modular_sdxl):
    """SDXL's modular denoise step calls the UNet once per prediction the guider asks for, batch `B` each. With SDXL's `EulerDiscreteScheduler` and a UNet without `time_cond_proj_dim`: `ClassifierFreeGuidance` two calls per step; `PerturbedAttentionGuidance` a third inside its window, at its defaults (0.01 to 0.2) step 1 alone of 10 steps, with the window at 0 to 1 steps 1 to 9. With the second-order `HeunDiscreteScheduler` the counts differ: 29 `ClassifierFreeGuidance` calls at 10 steps, not 20. With `time_cond_proj_dim` set, the step turns the guider off: 10 calls at 10 steps with either guider."""
    from diffusers import HeunDiscreteScheduler
    from diffusers.guiders import (
        ClassifierFreeGuidance,
        PerturbedAttentionGuidance,
        SkipLayerGuidance,
    )
    from diffusers.hooks import LayerSkipConfig

    unet, run, _ = modular_sdxl
    cfg = run(ClassifierFreeGuidance(guidance_scale=5.0))
    assert len(cfg) == 2 * 10 and all(e.shape[0] == 1 for e in cfg)
    fqn = next(n for n, _ in unet.named_modules() if n.endswith("transformer_blocks"))
    layer = dict(indices=[0], fqn=fqn, skip_attention=False, skip_attention_scores=True)
    pag = run(PerturbedAttentionGuidance(guidance_scale=5.0, perturbed_guidance_config=LayerSkipConfig(**layer)))  # fmt: skip
    assert len(pag) == 2 * 10 + 1 and all(e.shape[0] == 1 for e in pag)
    # SkipLayerGuidance at its default window (0.01 to 0.2): the same 21
    assert len(run(SkipLayerGuidance(guidance_scale=5.0, skip_layer_config=LayerSkipConfig(indices=[0], fqn=fqn)))) == 21  # fmt: skip
    full = run(PerturbedAttentionGuidance(guidance_scale=5.0, perturbed_guidance_config=LayerSkipConfig(**layer), perturbed_guidance_start=0.0, perturbed_guidance_stop=1.0))  # fmt: skip
    assert len(full) == 2 + 3 * 9  # step 0: two calls; steps 1 to 9: three
    # the third call of a step is the conditional branch again (prompt_embeds, not the negative)
    assert torch.equal(full[2 + 2], full[2]) and not torch.equal(full[2 + 1], full[2])
    # PAG accepts a negative start, and then step 0 gets a third call too (so no "never step 0")
    negative = run(PerturbedAttentionGuidance(guidance_scale=5.0, perturbed_guidance_config=LayerSkipConfig(**layer), perturbed_guidance_start=-0.5, perturbed_guidance_stop=1.0))  # fmt: skip
    assert len(negative) == 3 * 10
    # a second-order scheduler: 2n - 1 loop steps, and CFG's own range (int(stop * n)) ends at n
    assert HeunDiscreteScheduler.order == 2
    assert len(run(ClassifierFreeGuidance(guidance_scale=5.0), scheduler=HeunDiscreteScheduler)) == 2 * 10 + 9  # fmt: skip
    # a UNet with time_cond_proj_dim: the denoise step calls guider.disable(), one call per step
    assert len(run(ClassifierFreeGuidance(guidance_scale=5.0), lcm=True)) == 10
    full_lcm = run(PerturbedAttentionGuidance(guidance_scale=5.0, perturbed_guidance_config=LayerSkipConfig(**layer), perturbed_guidance_start=0.0, perturbed_guidance_stop=1.0), lcm=True)  # fmt: skip
    assert len(full_lcm) == 10


def test_seg_third_call_is_the_conditional_prediction(modular_sdxl, monkeypatch):
    """In SDXL's modular pipeline on diffusers 0.42.1, `SmoothedEnergyGuidance`'s blur hook never runs, so its third UNet call of a step returns the conditional prediction unchanged."""
    # PAG and SLG run alongside as the spies' control (their layer-skip hook is applied and
    # changes the third output). The page makes no claim about them: whether they weaken the
    # UNet depends on the scale, use_original_formulation, perturbed_guidance_scale and fqn.
    import diffusers.guiders.perturbed_attention_guidance as pag_module
    import diffusers.guiders.skip_layer_guidance as slg_module
    from diffusers.guiders import (
        PerturbedAttentionGuidance,
        SkipLayerGuidance,
        SmoothedEnergyGuidance,
    )
    from diffusers.guiders.smoothed_energy_guidance import SmoothedEnergyGuidanceConfig
    from diffusers.hooks import LayerSkipConfig
    from diffusers.hooks.smoothed_energy_guidance_utils import SmoothedEnergyGuidanceHook

    blurred = []
    post_forward = SmoothedEnergyGuidanceHook.post_forward
    monkeypatch.setattr(SmoothedEnergyGuidanceHook, "post_forward", lambda self, module, output: blurred.append(1) or post_forward(self, module, output))  # fmt: skip
    hooked = []
    for module in (pag_module, slg_module):
        apply = module._apply_layer_skip_hook
        monkeypatch.setattr(module, "_apply_layer_skip_hook", lambda *a, _apply=apply, **k: hooked.append(1) or _apply(*a, **k))  # fmt: skip
    unet, run, outputs = modular_sdxl
    fqn = next(n for n, _ in unet.named_modules() if n.endswith("transformer_blocks"))
    family = [
        PerturbedAttentionGuidance(guidance_scale=5.0, perturbed_guidance_config=LayerSkipConfig(indices=[0], fqn=fqn, skip_attention=False, skip_attention_scores=True), perturbed_guidance_start=0.0, perturbed_guidance_stop=1.0),
        SkipLayerGuidance(guidance_scale=5.0, skip_layer_config=LayerSkipConfig(indices=[0], fqn=fqn), skip_layer_guidance_start=0.0, skip_layer_guidance_stop=1.0),
        SmoothedEnergyGuidance(guidance_scale=5.0, seg_guidance_config=SmoothedEnergyGuidanceConfig(indices=[0], fqn=fqn)),
    ]  # fmt: skip
    for guider in family:  # two steps: step 0 two calls, step 1 three
        calls = run(guider, steps=2)
        assert len(calls) == 5 and torch.equal(calls[4], calls[2]), type(guider).__name__
        weakened = not torch.equal(outputs[4], outputs[2])
        assert weakened is not isinstance(guider, SmoothedEnergyGuidance), type(guider).__name__
    assert blurred == [] and len(hooked) == 2  # PAG's and SLG's step-1 third calls
    # guidance_scale=1 (the starter's scale-1 row): in the window the second, last call takes
    # the negative prompt's inputs
    for guider in (
        PerturbedAttentionGuidance(guidance_scale=1.0, perturbed_guidance_config=LayerSkipConfig(indices=[0], fqn=fqn, skip_attention=False, skip_attention_scores=True), perturbed_guidance_start=0.0, perturbed_guidance_stop=1.0),
        SkipLayerGuidance(guidance_scale=1.0, skip_layer_config=LayerSkipConfig(indices=[0], fqn=fqn), skip_layer_guidance_start=0.0, skip_layer_guidance_stop=1.0),
    ):  # fmt: skip
        calls = run(guider, steps=2)
        assert (
            len(calls) == 3
            and torch.equal(calls[2], embeds(2))
            and torch.equal(calls[1], embeds(1))
        )
        names = [getattr(b, guider._identifier_key) for b in guider.prepare_inputs({"prompt_embeds": (embeds(1), embeds(2))})]  # fmt: skip
        assert names == ["pred_cond", "pred_cond_skip"]  # no pred_uncond at scale 1
    assert len(hooked) == 2
    # ...but "at scale 1 nothing is weakened" is not a rule: with use_original_formulation=True
    # scale 1 keeps CFG on, and the third call is hooked again
    calls = run(PerturbedAttentionGuidance(guidance_scale=1.0, use_original_formulation=True, perturbed_guidance_config=LayerSkipConfig(indices=[0], fqn=fqn, skip_attention=False, skip_attention_scores=True), perturbed_guidance_start=0.0, perturbed_guidance_stop=1.0), steps=2)  # fmt: skip
    assert len(calls) == 5 and len(hooked) == 3 and torch.equal(calls[4], embeds(1))
