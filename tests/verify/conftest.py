"""The verify tests run only where the `verify` extra (torch + diffusers) is installed.

One module per page: ``test_page_<page>.py`` holds the tests for the claims that
page makes about diffusers' behaviour, and each test's docstring opens with the
claim it checks (the page lists those sentences; see infralens_docs.claims).

Shared here: the fixtures several modules use (a recorder for what a module's forward
receives, spies on pipeline methods, the attention-backend guard); the tiny random-config
parts they run on are built in ``tiny.py`` (no weights, no hub).
"""

from __future__ import annotations

import functools
import inspect
import re
from pathlib import Path

import pytest

pytest.importorskip(
    "torch", reason="the verify extra is not installed (pip install -e '.[verify]')"
)
pytest.importorskip(
    "diffusers", reason="the verify extra is not installed (pip install -e '.[verify]')"
)


# One intra-op thread: the tiny models gain nothing from two, and with the other core busy
# (the build, a browser) torch's thread pool spins and makes each call ~100x slower.
import torch

torch.set_num_threads(1)


#: A deprecation warning means a page teaches a name that is going away: it fails the test.
#: A test that provokes one on purpose catches it with ``pytest.warns``. Added before the
#: test's own marks, so a test's explicit filter (with its reason) is applied after it.
#: Two exceptions, shown in every run's warnings summary and never hidden, both NumPy 2
#: deprecating the signature of a torch 2.13 ``Tensor`` protocol method that diffusers' own
#: scheduler code reaches by handing a torch tensor to NumPy: ``__array__`` (no ``copy``
#: keyword; ``np.array(tensor)`` in ``set_timesteps``) and ``__array_wrap__`` (no ``context``;
#: ``np.log(tensor)`` in KDPM2's ``_sigma_to_t`` during ``step``). No name a page teaches is
#: involved, and no call of ours can avoid them.
DEPRECATIONS_ARE_ERRORS = [
    pytest.mark.filterwarnings("error::FutureWarning"),
    pytest.mark.filterwarnings("error::DeprecationWarning"),
    pytest.mark.filterwarnings(
        "default:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
    ),
    pytest.mark.filterwarnings("default:__array_wrap__ must accept context:DeprecationWarning"),
]


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/verify/" not in item.nodeid.replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.verify)
        # each goes first, so the list's last filter is applied last and wins (pytest applies
        # a test's marks in order; each warnings filter goes in front of the ones before it)
        for mark in reversed(DEPRECATIONS_ARE_ERRORS):
            item.add_marker(mark, append=False)


from tiny import HEIGHT, embeds, sd1_shaped_pipeline, start_latents, tiny_sd_pipeline  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def sizes_once_per_run(run_once):
    """``sizes.once_per_run``'s records (the Wan VAE decode peaks, SD 1.5's FLOPs, Flux at
    1024 px) are counted once per test run, not once per pytest-xdist worker."""
    import sizes

    sizes.RUN_ONCE = run_once
    yield
    sizes.RUN_ONCE = None


@pytest.fixture(scope="module")
def sd_pipe():
    return tiny_sd_pipeline()


@pytest.fixture(scope="module")
def sd1_shaped_pipe():
    """The real pipeline with a VAE of SD 1.x's four blocks: vae_scale_factor 8."""
    return sd1_shaped_pipeline()


class CallRecorder:
    """Records (args, kwargs) of every forward of a module, cloned, via a pre-hook."""

    def __init__(self, module):
        self.calls: list[tuple[tuple, dict]] = []
        self._handle = module.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module, args, kwargs):
        def clone(x):
            return x.detach().clone() if hasattr(x, "detach") else x

        self.calls.append((tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()}))

    def remove(self):
        self._handle.remove()


@pytest.fixture
def record_calls():
    """``record_calls(module) -> CallRecorder``; hooks are removed after the test."""
    recorders = []

    def attach(module):
        recorder = CallRecorder(module)
        recorders.append(recorder)
        return recorder

    yield attach
    for recorder in recorders:
        recorder.remove()


@pytest.fixture(autouse=True)
def restore_diffusers_verbosity():
    """Some tests silence diffusers' logging (set_verbosity_error); put it back after each,
    so a test that checks a logged warning sees it whatever ran before."""
    from diffusers.utils import logging

    level = logging.get_verbosity()
    yield
    logging.set_verbosity(level)


@pytest.fixture
def default_backend():
    """Every test leaves the process-wide active attention backend as it found it (`native`)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    assert _AttentionBackendRegistry._active_backend == AttentionBackendName.NATIVE
    yield
    _AttentionBackendRegistry.set_active_backend(AttentionBackendName.NATIVE)


@pytest.fixture
def quiet_diffusers():
    """from_pretrained logs progress bars and an accelerate hint; keep the test log clean.
    A module opts in with ``pytestmark = pytest.mark.usefixtures("quiet_diffusers")``."""
    from diffusers.utils import logging as dlogging

    level = dlogging.get_verbosity()
    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()
    yield
    dlogging.set_verbosity(level)
    dlogging.enable_progress_bar()


@pytest.fixture
def calls_of(monkeypatch):
    """``spy(obj, name) -> list``: (args, kwargs) of every call of the method ``obj.name``."""

    def spy(obj, name):
        seen = []
        original = getattr(obj, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            seen.append((args, kwargs))
            return original(*args, **kwargs)

        monkeypatch.setattr(obj, name, wrapper)
        return seen

    return spy


@pytest.fixture
def guidance_rescale_calls(monkeypatch):
    """``run(pipe, module, **kwargs) -> (calls, steps)``: one 2-step call of a tiny SD-family
    pipeline; ``calls`` are (guided, noise_pred_text, guidance_rescale, result) of every
    ``rescale_noise_cfg`` the pipeline module makes, ``steps`` every ``scheduler.step``'s
    ``model_output``."""

    def run(pipe, module, **kwargs):
        calls, steps = [], []
        original = module.rescale_noise_cfg

        @functools.wraps(original)
        def spy(noise_cfg, noise_pred_text, guidance_rescale=0.0):
            out = original(noise_cfg, noise_pred_text, guidance_rescale=guidance_rescale)
            calls.append((noise_cfg.clone(), noise_pred_text.clone(), guidance_rescale, out.clone()))  # fmt: skip
            return out

        step = pipe.scheduler.step

        def step_spy(model_output, timestep, sample, *args, **kw):
            steps.append(model_output.detach().clone())
            return step(model_output, timestep, sample, *args, **kw)

        monkeypatch.setattr(module, "rescale_noise_cfg", spy)
        monkeypatch.setattr(pipe.scheduler, "step", step_spy)
        extra = kwargs.pop("extra", {})
        with torch.no_grad():
            pipe(prompt_embeds=embeds(1), negative_prompt_embeds=embeds(2), latents=start_latents(),
                 num_inference_steps=2, height=HEIGHT, width=HEIGHT, output_type="latent",
                 **extra, **kwargs)  # fmt: skip
        monkeypatch.undo()
        return calls, steps

    return run


# ---------------------------------------------------------------- each sentence names its pipelines
#
# Issue 31: a tested sentence said what one pipeline's ``__call__`` does as if it were diffusers'
# (or "CFG's") in general, while another installed pipeline does otherwise. So the sentence the
# page shows for a test (its docstring's first paragraph, read by ``infralens_docs.claims``, which
# renders the list) must name every pipeline class whose ``__call__`` or other public method
# (``encode_prompt``, ``prepare_latents``, ...) ran for the test: in the test itself or in a fixture
# it uses (a module-scoped fixture that runs a pipeline once counts for every test reading it).
# A run is "for the test" however it is reached: there is no list of exempt tests or helpers.
#
# The hook is on the classes, not on a list of them: every public function (and ``__call__``)
# that a subclass of ``DiffusionPipeline`` defines in its own ``__dict__`` is wrapped, for the
# classes already imported (found through ``__subclasses__``) and for every one defined later
# (diffusers imports its pipelines lazily) through ``DiffusionPipeline.__init_subclass__``.
# ``DiffusionPipeline``'s own methods (``to``, ``enable_model_cpu_offload``, ...) and the loader
# mixins' (``load_lora_weights``) are the same code for every pipeline and are not recorded.
# The wrapper only records: behaviour is the original's, and so is the signature
# (``functools.wraps`` sets ``__wrapped__``, which ``inspect.signature`` follows).

from diffusers import DiffusionPipeline  # noqa: E402

from infralens_docs.claims import read_claims  # noqa: E402

#: one set of (class name, method) per running test call or fixture setup
_RECORDING: list[set[tuple[str, str]]] = []


def _shown_name(pipe, owner) -> str:
    """The diffusers class a reader would name: a test's own subclass names its diffusers parent;
    a method called unbound on a stand-in object (``Cls.get_timesteps(stand_in, ...)``) names
    the class whose code ran."""
    if not isinstance(pipe, owner):
        return owner.__name__
    return next(c for c in type(pipe).__mro__ if c.__module__.startswith("diffusers.")).__name__


def _recorded(method, owner):
    @functools.wraps(method)
    def recorded(self, *args, **kwargs):
        if _RECORDING:
            entry = (_shown_name(self, owner), method.__name__)
            for seen in _RECORDING:
                seen.add(entry)
        return method(self, *args, **kwargs)

    recorded._infralens_recorded = True
    return recorded


def _record_calls(cls) -> None:
    for name, value in list(vars(cls).items()):
        if (name == "__call__" or not name.startswith("_")) and inspect.isfunction(value):
            if not getattr(value, "_infralens_recorded", False):
                setattr(cls, name, _recorded(value, cls))


def _record_tree(cls) -> None:
    for sub in cls.__subclasses__():
        _record_calls(sub)
        _record_tree(sub)


def _init_subclass(cls, **kwargs):
    super(DiffusionPipeline, cls).__init_subclass__(**kwargs)
    _record_calls(cls)


assert "__init_subclass__" not in vars(DiffusionPipeline), "diffusers now defines one: chain it"
DiffusionPipeline.__init_subclass__ = classmethod(_init_subclass)
_record_tree(DiffusionPipeline)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    seen: set[tuple[str, str]] = set()
    _RECORDING.append(seen)
    try:
        return (yield)
    finally:
        _RECORDING.remove(seen)
        fixturedef.infralens_pipelines_run = seen


_SENTENCES: dict[Path, dict[str, str]] = {}


def _names(sentence: str, name: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", sentence) is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    seen: set[tuple[str, str]] = set()
    _RECORDING.append(seen)
    try:
        result = yield
    finally:
        _RECORDING.remove(seen)
    path = Path(item.path)
    if not path.name.startswith("test_page_"):
        return result  # no page shows these tests' sentences
    for name in item.fixturenames:
        fixturedefs = item._fixtureinfo.name2fixturedefs.get(name)
        if fixturedefs:
            seen |= getattr(fixturedefs[-1], "infralens_pipelines_run", set())
    if not seen:
        return result
    if path not in _SENTENCES:
        _SENTENCES[path] = {c.test: c.text for c in read_claims(path)}
    sentence = _SENTENCES[path][item.originalname]
    missing = sorted({(cls, method) for cls, method in seen if not _names(sentence, cls)})
    if missing:
        ran = ", ".join(f"`{cls}.{method}`" for cls, method in missing)
        pytest.fail(
            f"this test runs {ran}, and its sentence on the page does not name the class: what"
            f" one pipeline does is not said of diffusers in general (issue 31).\n"
            f"Sentence: {sentence}",
            pytrace=False,
        )
    return result
