"""Lab 17: can you write the loop of a text-to-image pipeline yourself, from its parts?

The parts are Lab 12's toy world (shape images, a patch-PCA "VAE", the exact denoiser of
its latents) with a NumPy scheduler of SD 1.5's config; the loop that joins them is
yours. Five blanks (seven lines) are left: the doubled batch and its order, scale_model_input,
the chunk(2) guidance line, scheduler.step and the division by scaling_factor before
decode. The trap: each can be written wrong and still return an image, so the checker
compares what your loop hands each part with what the solution hands it, call by call.

Run it:  python3 code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py
Check it:  python3 code/lab-17-rebuild-the-pipeline/rebuild_pipeline.py --check
The solution's pipeline() in place of yours:  add --solution (solution.py holds it)
"""

import sys
from pathlib import Path

import numpy as np

# labkit, the labs' shared code, is code/labkit: code/ goes on the path so that this file
# runs from a fresh clone with any Python that has NumPy, nothing installed (a notebook
# has no __file__: there labkit comes from `pip install -e .`)
if "__file__" in globals():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
try:
    import labkit  # noqa: F401
except ModuleNotFoundError as missing:  # a copy away from code/: one line, not a traceback
    if missing.name != "labkit":
        raise
    print(f"{Path(sys.argv[0]).name}: error: labkit (code/labkit) is not beside this file: run the copy in the repository's code/lab-17-rebuild-the-pipeline/", file=sys.stderr)  # fmt: skip
    sys.exit(2)

from labkit import ExactDenoiser, alphas_cumprod, canonical_betas, figures
from labkit.blanks import (
    Spy,
    UnfilledBlankError,
    blank_at,
    error_site,
    innermost_line,
    is_generator,
    lines_run,
    load_constant,
    load_function,
    loop_heads,
    source_line,
)
from labkit.blanks import blank as blank  # the placeholder; solution.py has none left
from labkit.cli import (
    LabArgumentParser,
    add_figures_argument,
    add_pipeline_arguments,
    check_pipeline_arguments,
    parse_args,
)
from labkit.denoiser import UNCOND
from labkit.images import SHAPES, FiniteSet, image_grid, toy_images
from labkit.schedulers import DDIMScheduler, EulerDiscreteScheduler
from labkit.vae import PatchPCAAutoencoder

# %% [markdown]
# ## 1. The parts
#
# Lab 12's toy world, built the same way: 256 training images of four shapes, the
# patch-PCA autoencoder fitted to them as the `vae`, their latents times
# `vae.config.scaling_factor` (unit std), and the exact denoiser of those latents as the
# `unet`. The scheduler has SD 1.5's betas; Euler by default, because there
# `scale_model_input` is not the identity.

# %%
# --8<-- [start:parts]
parser = LabArgumentParser(prog=Path(sys.argv[0]).name, description=__doc__.splitlines()[0])
parser.add_argument("--prompt", choices=SHAPES, default="disc", help="the class to generate")
add_pipeline_arguments(parser, guidance_help="CFG scale, >= 0")  # and --steps, --num-samples
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--scheduler", choices=["euler", "ddim"], default="euler")
parser.add_argument(
    "--check", action="store_true",
    help="compare your pipeline() with solution.py's, call by call; exit 1 if a blank differs",
)  # fmt: skip
parser.add_argument(
    "--solution", action="store_true",
    help="use solution.py's pipeline() in place of yours (for the run, --check and --figures)",
)  # fmt: skip
parser.add_argument(
    "--demo-wrong", type=int, choices=range(1, 6), metavar="N",
    help="check solution.py's pipeline() with a known mistake planted in blank N (1-5)",
)  # fmt: skip
add_figures_argument(parser)
args = parse_args(parser)
# Lab 12's bounds, with its one-line errors; DDIM's leading grid with SD 1.5's steps_offset=1
# reaches t = 1000 at 1000 steps, past alphas_cumprod (diffusers raises IndexError there too)
if args.scheduler == "ddim":
    check_pipeline_arguments(parser, args, 999, "DDIM with steps_offset=1 would reach t=1000")
else:
    check_pipeline_arguments(parser, args)
if args.figures and (args.check or args.demo_wrong):  # the figures are drawn from a run
    parser.error("--figures draws a run's images: use it without --check and --demo-wrong")

data = toy_images(256, seed=0)  # .images (K, 3, 32, 32) in [-1, 1], .labels (K,)
vae = PatchPCAAutoencoder.fit(data.images, patch_size=8, latent_channels=4)  # Lab 05
training_latents = vae.encode(data.images) * vae.config.scaling_factor  # (K, 4, 4, 4), std 1
training_set = FiniteSet(training_latents, data.labels)  # the data the "unet" knows exactly
unet = ExactDenoiser(training_set, alphas_cumprod(canonical_betas("scaled_linear")), "epsilon")
SD15 = dict(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, steps_offset=1)


def make_scheduler(kind):
    """A fresh scheduler with SD 1.5's config (its step index starts from scratch)."""
    if kind == "ddim":  # Lab 12's: scale_model_input is the identity, init_noise_sigma 1
        return DDIMScheduler(**SD15, set_alpha_to_one=False, clip_sample=False)
    # EulerDiscreteScheduler.from_config(SD 1.5's config): init_noise_sigma = sigma_max ~ 14.6
    return EulerDiscreteScheduler(**SD15)


# --8<-- [end:parts]

# %% [markdown]
# ## 2. The inputs
#
# What `StableDiffusionPipeline.__call__` has once `encode_prompt` has run: the prompt's
# condition and the negative prompt's, one row per image, and the starting noise. The
# toy's condition is a class label per row, `(B,)`, with `UNCOND` (-1) for the empty
# prompt; in SD 1.x these are `(B, 77, 768)` text embeddings.

# %%
# --8<-- [start:inputs]
B, n = args.num_samples, args.steps
class_labels = np.full(B, SHAPES.index(args.prompt))  # (B,): the toy's prompt_embeds
negative_class_labels = np.full(B, UNCOND)  # (B,): the empty prompt ""
noise = np.random.default_rng(args.seed).standard_normal((B, 4, 4, 4))  # (B, 4, h, w)
# --8<-- [end:inputs]

# %% [markdown]
# ## 3. Your part: the pipeline
#
# The lines of `StableDiffusionPipeline.__call__` from the doubled condition to the
# decoded image, as it runs when it guides (`guidance_scale > 1`), on these parts. Each `blank(n)` is a line to write; the comment above it
# gives the shapes and a hint. `solution.py` holds this function with the blanks filled
# in; the two differ on those lines only.


# %%
# --8<-- [start:pipeline]
def pipeline(
    unet, scheduler, vae, prompt_embeds, negative_prompt_embeds, latents,
    num_inference_steps, guidance_scale,
):  # fmt: skip
    """Latents (B, 4, h, w) of noise and conditions (B, ...) -> images (B, 3, H, W)."""
    # BLANK 1 of 5 · the doubled batch and its order (this line and one in the loop). One
    # unet call serves both halves of classifier-free guidance: 2B condition rows, here
    # (2B,) labels, in SD 1.x (2B, 77, 768). The order is a convention blank 3 must follow;
    # diffusers puts the negative prompt's rows first.
    prompt_embeds = blank(1)

    scheduler.set_timesteps(num_inference_steps)  # scheduler.timesteps: (n,), high to low
    latents = latents * scheduler.init_noise_sigma  # the std the scheduler starts from

    for t in scheduler.timesteps:
        # BLANK 1 (continued) · the latents, doubled to match: (B, 4, h, w) -> (2B, 4, h, w),
        # each half the whole batch.
        latent_model_input = blank(1)

        # BLANK 2 of 5 · what the unet sees at t is the scheduler's business: Euler keeps
        # its latents on a larger scale than the one the unet was trained on (up to
        # init_noise_sigma), DDIM does not. (2B, 4, h, w) in and out.
        latent_model_input = blank(2)

        noise_pred = unet(latent_model_input, t, class_labels=prompt_embeds)  # (2B, 4, h, w)

        # BLANK 3 of 5 · the chunk(2) guidance line: cut the prediction into its two
        # halves in blank 1's order, then go from the unconditional prediction towards
        # the conditional one, guidance_scale times their difference: (B, 4, h, w).
        noise_pred_uncond, noise_pred_text = blank(3)  # noqa: RUF059
        noise_pred = blank(3)  # noqa: F841

        # BLANK 4 of 5 · one scheduler update x_t -> x_{t-1}: the guided prediction, this
        # timestep, and the B latents the loop carries (not the doubled, scaled input).
        # The result holds two arrays; keep the one the next iteration needs.
        latents = blank(4)

    # BLANK 5 of 5 · the unet's latents have unit std because the training latents were
    # multiplied by vae.config.scaling_factor; the decoder wants the scale it encoded to.
    image = vae.decode(blank(5))  # (B, 3, H, W), about [-1, 1]
    return image


# --8<-- [end:pipeline]

# %% [markdown]
# ## 4. Run it
#
# A blank still to fill stops the run with its number; an error in your lines, with
# the line that raised and its blank (`--check` says more). Filled in, the images
# come out, and the exact denoiser gives a check any reader can run: it memorises its
# training set, so each image, encoded back, should sit on a training latent of the
# prompted class (Lab 12). `--solution` runs solution.py's `pipeline()` instead of yours,
# read from that file by `load_function` (its imports and its `def`, nothing else).

# %%
# --8<-- [start:run]
#: solution.py, beside this file (a notebook has no __file__; it runs in this folder)
SOLUTION = Path(globals().get("__file__", "solution.py")).resolve().with_name("solution.py")
if not SOLUTION.is_file() and (args.check or args.solution or args.demo_wrong or args.figures):
    parser.error(f"solution.py is not beside this file ({SOLUTION.parent}): run the copy in the repository's code/lab-17-rebuild-the-pipeline/")  # fmt: skip

#: (call, argument) -> (the blank that computes it, its rows in units of B): the contract
#: between the parts. The unet sees 2B rows, everything else B; every latent keeps the
#: noise's (4, h, w) and float64, the condition rows class_labels' dtype.
CONTRACT = {
    ("unet", "class_labels"): (1, 2),
    ("scheduler.scale_model_input", "sample"): (1, 2),
    ("unet", "sample"): (2, 2),
    ("scheduler.step", "model_output"): (3, 1),
    ("scheduler.step", "sample"): (4, 1),
    ("vae.decode", "latents"): (5, 1),
}
#: the call -> the blank whose lines run just before it: at step 1 your latents at these calls
#: are still the scaled noise, so a change there is that blank's (say blank 1 doubling latents)
BEFORE = {"scheduler.scale_model_input": 1, "unet": 2, "scheduler.step": 3}
#: scaling B rows, then doubling, gives the same numbers; the checker follows diffusers' calls
SCALE_THEN_DOUBLE = " (diffusers doubles, then scales: its convention, which the checker follows)"
#: (call, argument) -> (the variable that should hold it, the blank that passes it): when
#: the argument is wrong but that variable held the right thing at the call, the blank
#: that passes it is wrong, not the one that computed it (a Spy records your variables)
PASSED_AS = {
    ("scheduler.scale_model_input", "sample"): ("latent_model_input", 2),
    ("scheduler.step", "model_output"): ("noise_pred", 4),
}


#: pipeline function -> the lines of it that its last run executed, in order (the last one
#: is where it returned): which line left the loop early, or cut an iteration short
EXECUTED = {}
#: said when a breakpoint() in your pipeline() took over the trace that records its lines
UNTRACED = "(a breakpoint() in your pipeline() replaced the trace that records its lines: no line of the loop is named; run without it to see which)"  # fmt: skip


def traced(fn):
    """EXECUTED[fn], or [] if a debugger's breakpoint() took over its trace partway."""
    executed = EXECUTED.get(fn, [])
    return executed if getattr(executed, "whole", True) else []


def run_on_spies(fn):
    """Run pipeline ``fn`` with a fresh scheduler and the shared unet and vae (stateless
    but for the unet's call counter), each wrapped in labkit's Spy, which records the
    arguments of each watched call and each attribute write (passed on to the part), and
    your array variables at that moment: (calls, image, error). The lines ``fn`` runs go
    to EXECUTED[fn] (labkit's lines_run; a debugger's breakpoints in ``fn`` still stop)."""
    calls = []
    parts = [
        Spy("unet", unet, calls, ["__call__"]),
        Spy("scheduler", make_scheduler(args.scheduler), calls, ["scale_model_input", "step"]),
        Spy("vae", vae, calls, ["decode"]),
    ]
    with lines_run(fn) as EXECUTED[fn]:
        try:
            out = fn(*parts, class_labels, negative_class_labels, noise,
                     num_inference_steps=n, guidance_scale=args.guidance_scale)  # fmt: skip
            return calls, out, None
        except (Exception, KeyboardInterrupt, SystemExit) as error:  # a blank to fill, your
            return calls, None, error  # code failing, exit() or Ctrl-C in it: no traceback


def where_is(fn, line):
    """``line 147, the for line, outside the blanks``: a line of ``fn`` and its blank."""
    number = blank_at(fn, line)
    if number:
        return f"line {line} (in blank {number})"
    text = source_line(fn, line)
    return f"line {line} ({'the for line, ' if text.startswith('for ') else ''}outside the blanks)"


def skipped_at(fn, calls):
    """(line, iteration) of the ``continue`` that cut an iteration of ``fn``'s loop short:
    the first iteration (of the loop outside the blanks that runs the unet's line, a ``for``
    in blank 1 aside) that ends on a ``continue`` line and holds no line that called
    ``step``. None if none does, or the loop made a ``step`` call per iteration it ran."""
    stepping = {call.line for call in calls if call.method == "scheduler.step"}
    inside = [call.line for call in calls if call.method in ("unet", *BEFORE)]
    heads = next(filter(None, (loop_heads(fn, line) for line in inside)), loop_heads(fn)[:1])
    executed = traced(fn)
    marks = [k for k, line in enumerate(executed) if heads and line == heads[-1]]
    if len(stepping) and sum(call.method == "scheduler.step" for call in calls) >= len(marks) - 1:
        return None  # a step for every iteration that went back to the for line
    iteration, inside_loop = 0, {}  # line -> whether that loop holds it
    for k in range(1, len(marks)):  # the lines run from one pass over its head to the next
        a, b = marks[k - 1], marks[k]
        body = executed[a + 1 : b]
        if body and body[0] not in inside_loop:
            inside_loop[body[0]] = heads[-1] in loop_heads(fn, body[0])
        if not body or not inside_loop[body[0]]:  # it ran out and an outer loop restarted it
            continue
        iteration += 1
        code = source_line(fn, executed[b - 1]).split("#")[0]
        ends = code.replace(" ", "") == "continue" or code.replace(" ", "").endswith(":continue")
        if ends and not stepping & set(body):
            return body[-1], iteration
    return None


def cut(fn, line, iteration):
    """What a ``continue`` at ``line`` did to iteration ``iteration`` of your loop."""
    return f"your loop cut iteration {iteration} of {n} short before its step, at {where_is(fn, line)}"  # fmt: skip


def loop_left_at(fn, call=None):
    """The line of ``fn`` that ended its loop early: the line that made ``call`` (a decode
    made in another blank's lines), else the line run just before it (a ``break``, or the
    ``for`` line running out), or, with no call, the line ``fn`` returned from. None if
    the trace did not see the whole run."""
    executed = traced(fn)
    if call is None:
        return executed[-1] if executed else None
    if not executed:
        return None
    if blank_at(fn, call.line) not in (None, 5) or call.line not in executed:
        return call.line
    first = executed.index(call.line)
    return executed[first - 1] if first else call.line


def describe(value):
    """An argument in a few words: an array's shape and dtype, or what else it is."""
    if isinstance(value, np.ndarray):
        return f"{value.shape} {value.dtype}"
    kind = type(value).__name__
    return f"{'an' if kind[0] in 'aeiouAEIOU' else 'a'} {kind}"


def plural(count, noun):
    """``1 step``, ``20 steps``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def fits(value, shape, dtype):
    """An array of this shape and dtype."""
    return isinstance(value, np.ndarray) and value.shape == shape and value.dtype == dtype


def contract_break(calls):
    """Where the first argument that breaks CONTRACT is, and which blank, or None."""
    step = 1
    for call in calls:
        for (method, arg), (number, rows) in CONTRACT.items():
            like = class_labels if arg == "class_labels" else noise
            shape, value = (rows * B, *like.shape[1:]), call.arguments.get(arg)
            if method != call.method or fits(value, shape, like.dtype):
                continue
            variable, passer = PASSED_AS.get((method, arg), (None, None))
            held = call.caller_arrays.get("latents")  # your latents when the call was made
            if arg == "sample" and number == 1 and step == 1 and isinstance(held, np.ndarray) and not fits(held, noise.shape, noise.dtype) and isinstance(value, np.ndarray) and value.dtype == held.dtype and np.array_equal(value, np.concatenate([held] * 2)):  # fmt: skip
                return f"your latents break the contract before blank 1 doubles them (step 1 of {n}): they are {describe(held)}, and {method}({arg}=...) gets them doubled, {describe(value)}; the loop carries {noise.shape} {noise.dtype}, B = {B} rows: compare the lines before this call"  # fmt: skip
            if variable and fits(call.caller_arrays.get(variable), shape, like.dtype):
                number = passer  # the right variable was there: this blank passed another
            elif arg == "sample" and number < 3 and step > 1:
                number = 4  # step 1 was right: the latents step returned, carried over, are not
            elif number == 5 and "latents" in call.caller_arrays and not fits(call.caller_arrays["latents"], shape, like.dtype):  # fmt: skip
                number = 4  # the latents the last step left break it already: blank 4 kept them
            where = "after the loop" if step > n else f"step {step} of {n}"
            rows_are = f"2B = {2 * B}" if rows == 2 else f"B = {B}"
            text = f"blank {number} breaks the contract ({where}): {method}({arg}=...) gets {describe(value)}; it takes {shape} {like.dtype}, {rows_are} rows"  # fmt: skip
            if number == 1 and method == "scheduler.scale_model_input" and fits(value, (B, *shape[1:]), like.dtype):  # fmt: skip
                text += SCALE_THEN_DOUBLE
            return text
        latents = call.caller_arrays.get("latents")  # absent: called from a helper of yours
        if step == 1 and call.method in BEFORE and "latents" in call.caller_arrays and not fits(latents, noise.shape, noise.dtype):  # fmt: skip
            number = BEFORE[call.method]  # the loop's latents changed before step 1's step
            return f"blank {number} breaks the contract (step 1 of {n}): your latents are {describe(latents)} when it calls {call.method}; the loop carries {noise.shape} {noise.dtype}, B = {B} rows, and only blank 4 changes it"  # fmt: skip
        step += call.method == "scheduler.step"
    return None


def return_break(image):
    """What is wrong with pipeline()'s return value, or None: it must be vae.decode's images."""
    decoded = (B, *data.images.shape[1:])
    if fits(image, decoded, np.float64):
        return None
    why = " (a yield makes pipeline() a generator, which runs none of its lines)" if is_generator(image) else ""  # fmt: skip
    return f"your pipeline() returns {describe(image)}{why}; return the decoded images, {decoded} float64"  # fmt: skip


def raised(error, fn, calls=()):
    """What ``error`` in your ``fn`` was, and where: its line and the blank it belongs to,
    or the part whose call on that line raised (``calls``: the run's recorded calls)."""
    line, number, variables = error_site(error, fn)  # labkit.blanks reads the traceback
    quit_debugger = type(error).__name__ == "BdbQuit"  # q typed at a breakpoint()'s (Pdb) prompt
    text = " ".join(str(error).split())  # one line, whatever the message
    latents = variables.get("latents", np.zeros(0))
    if not isinstance(latents, np.ndarray):  # e.g. step's whole output, kept by blank 4
        return f"blank 4 is wrong: latents is a {type(latents).__name__}, not an array\nso your pipeline raised {type(error).__name__} at line {line}: {text}"  # fmt: skip
    if line is None:  # raised by the call itself: pipeline()'s parameters were changed
        return f"calling your pipeline() raised {type(error).__name__}: {text} (keep its parameters as the file gives them)"  # fmt: skip
    last = calls[-1] if calls else None
    in_part = last is not None and last.line == line and last.result is None and not last.method.endswith(" =")  # fmt: skip
    if number:
        where = f"line {line} (in blank {number})"
    elif in_part and isinstance(error, KeyboardInterrupt):  # Ctrl-C while a part ran
        where = f"line {line}, while {last.method} ran"
    elif isinstance(error, KeyboardInterrupt) or quit_debugger:  # Ctrl-C or pdb's q on a given line
        where = f"line {line}, outside the blanks"
    elif in_part:  # a given line: the part it calls failed on what the blanks handed it
        where = f"line {line}, inside {last.method}, which failed on the arguments your blanks gave it"  # fmt: skip
    else:
        where = f"line {line}, outside the blanks (a blank's lines end at the first empty line after its # BLANK comment)"  # fmt: skip
    deepest = innermost_line(error, fn.__code__.co_filename)  # a helper of yours that raised
    if deepest and deepest[1] != line:
        where += f", from your {deepest[0]}() at line {deepest[1]}"
    if (
        "return_dict" in text
    ):  # diffusers' step(..., return_dict=False)[0]: labkit's step has no such argument
        text += " (the toy's step has no return_dict: step(...)[0] or .prev_sample)"
    if isinstance(error, KeyboardInterrupt):  # Ctrl-C: where your pipeline was running
        text = "interrupted there (Ctrl-C): a loop of yours that does not end?"
    elif quit_debugger:
        text = "you quit the debugger (pdb's q) there"
    elif isinstance(error, SystemExit):
        text = f"exit({text}) ends the whole run: pipeline() must return the images"
    return f"your pipeline raised {type(error).__name__} at {where}: {text}"


def unfilled(error):
    """Which blank is next, and in which file (yours may have another name)."""
    # in a notebook the blank's file is a cell: the notebook is this file
    where = Path(error.filename).name if "__file__" in globals() else "rebuild_pipeline.py"
    return f"blank {error.number} of 5 is not filled in yet: find blank({error.number}) in {where}"  # fmt: skip


def load_solution(mistake=None):
    """solution.py's pipeline(); with ``mistake`` N, a copy with its MISTAKES[N] planted."""
    edit = load_constant(SOLUTION, "MISTAKES")[mistake] if mistake else None
    return load_function(SOLUTION, "pipeline", edit)


#: where StableDiffusionPipeline stops guiding; printed with a run's verdict at those scales
GUIDE_NOTE = "note: StableDiffusionPipeline does not guide at guidance_scale <= 1 (one batch, the prompt's rows alone); this loop always guides: at 1 that is the prompt's prediction on 2B rows, at 0 the unconditional one"  # fmt: skip
yours = load_solution() if args.solution else pipeline
image, name = None, type(make_scheduler(args.scheduler)).__name__
if not (args.check or args.demo_wrong):
    calls, image, error = run_on_spies(yours)
    broken = contract_break(calls)
    ran = sum(call.method == "unet" for call in calls)  # the unet's line runs once a step
    done = sum(call.method == "scheduler.step" for call in calls)
    if broken is None and error is None and skipped_at(yours, calls):  # a continue
        broken = f"{cut(yours, *skipped_at(yours, calls))}: {plural(done, 'step')} of {n} ran"
    elif broken is None and error is None and min(ran, done) < n and EXECUTED[yours]:  # a break or return, or steps skipped  # fmt: skip
        decoded = next((call for call in calls if call.method == "vae.decode"), None)
        left = loop_left_at(yours, decoded) if ran < n else None  # the line that left the loop
        at = f", at {where_is(yours, left)}" if left else "" if traced(yours) else f" {UNTRACED}"
        broken = f"your loop {'stopped after' if left else 'made'} {plural(done, 'step')} of {n}{at}"  # fmt: skip
    broken = broken or (return_break(image) if error is None else None)
    if broken is None and error is None and not np.isfinite(image).all():  # inf or NaN
        broken = f"the images hold {np.isnan(image).sum()} NaN and {np.isinf(image).sum()} inf values of {image.size}: no image to judge"  # fmt: skip
    for text in dict.fromkeys(f"{c.method} warned: {w}" for c in calls for w in c.warnings):
        print(text)  # each warning a part raised, once
    if broken is None and isinstance(error, UnfilledBlankError):
        print(unfilled(error))
        print("replace blank(...) there with your code; the comment above it says what goes there")  # fmt: skip
    elif broken or error:  # a wrong shape or dtype, or your own lines failed: a line each
        if broken:
            print(broken)
        if error is not None:
            print(("then " if broken else "") + raised(error, yours, calls))
        if args.guidance_scale <= 1:  # an `if guidance_scale > 1` branch breaks this contract
            print(GUIDE_NOTE)
        print("add --check to compare your blanks with the solution's, call by call")
        sys.exit(1)
if image is not None:
    print(f"pipeline(): prompt {args.prompt!r}, guidance_scale {args.guidance_scale:g}, {plural(n, 'step')} of {name}, B = {B}")  # fmt: skip
    print(f"unet: {plural(unet.calls, 'call')} on {unet.rows // unet.calls} rows each")
    print(f"image: {image.shape} {image.dtype}, range {image.min():.2f}..{image.max():.2f}")
    latents_back = vae.encode(image) * vae.config.scaling_factor  # the linear vae inverts exactly
    nearest, rms = training_set.nearest(latents_back)
    purity = np.mean(data.labels[nearest] == SHAPES.index(args.prompt))
    print(f"nearest training latent has the prompt's label: {purity:.1%} of {len(image)} (RMS distance max {rms.max():.3f})")  # fmt: skip
    if args.guidance_scale <= 1:  # where StableDiffusionPipeline stops guiding
        print(GUIDE_NOTE)
    if not args.solution:
        print("next: add --check to compare every blank with the solution's")
# --8<-- [end:run]

# %% [markdown]
# ## 5. The checker
#
# `--check` runs your `pipeline()` and the solution's on the same inputs, each with a fresh
# scheduler, the parts wrapped in a `Spy` that records the arguments of every call: the unet's input and
# condition, `scale_model_input`'s, `step`'s, the decoder's, and your array variables at
# each call. It compares the two lists in call order; the first argument that differs
# names the blank that computed it, or the one that passed it if the variable that should
# hold it matches. A call yours skips names the blank that owns it; an extra call, or a
# write to a part's attribute, the blank whose lines made it; a loop that stops early, the
# line that left it, and a `continue` that cuts an iteration short, its own line (labkit's
# `lines_run` records the lines your pipeline() runs).

# %%
# --8<-- [start:check]
#: (call, argument) -> (the blank that computes it, what it is), in the order checked
BOUNDARIES = {
    ("unet", "class_labels"): (1, "prompt_embeds after doubling: the condition rows"),
    ("scheduler.scale_model_input", "sample"): (1, "latent_model_input after doubling"),
    ("scheduler.scale_model_input", "timestep"): (2, "the timestep given to scale_model_input"),
    ("unet", "sample"): (2, "latent_model_input after scale_model_input"),
    ("scheduler.step", "model_output"): (3, "noise_pred after guidance"),
    ("scheduler.step", "timestep"): (4, "the timestep given to step"),
    ("scheduler.step", "sample"): (4, "the latents given to step"),
    ("vae.decode", "latents"): (5, "the decoder's input"),
}
#: a call the solution makes and yours does not, or the other way round -> its blank
CALL_OF = {"scheduler.scale_model_input": 2, "scheduler.step": 4, "vae.decode": 5}
#: the numbers (NumPy scalars and arrays, not a SchedulerOutput or None) the checker compares
NUMBERS = (np.ndarray, np.number, int, float)


def show(value):
    """A short description of one argument: its shape and dtype, and the values if few."""
    if not isinstance(value, NUMBERS):
        return describe(value)
    value = np.asarray(value)
    if value.dtype.kind not in "biufc":  # strings, objects: no values to measure
        return f"{value.shape} {value.dtype}"
    if value.ndim == 0 or (value.ndim == 1 and value.dtype.kind in "biu"):
        return f"{value.shape} {value.dtype} {np.array2string(value, threshold=20)}"
    if value.size == 0:  # e.g. a slice past the batch: no values to describe
        return f"{value.shape} {value.dtype}, empty"
    return f"{value.shape} {value.dtype}, max |value| {np.abs(value).max():.4g}"


def same(a, b):
    """Equal shapes, dtypes (of arrays; a timestep may be an int or a float) and values, to
    rounding: a different but equal formula passes."""
    if not (isinstance(a, NUMBERS) and isinstance(b, NUMBERS)):
        return a is b
    a, b = np.asarray(a), np.asarray(b)
    if (a.ndim and a.dtype != b.dtype) or a.dtype.kind not in "biuf":
        return False
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-7, atol=1e-9)


def first_difference(yours, reference, complete=True, fn=None):
    """The first (blank, step, message) where the two call lists differ, or None.
    ``complete=False``: your run stopped early, so only the calls it made are compared.
    ``fn``: your pipeline, whose blank paragraphs name the blank of a call made in one."""
    step, skipped = 1, skipped_at(fn, yours) if fn else None  # a continue in your loop
    for k, ref in enumerate(reference[: None if complete else len(yours)]):
        mine = yours[k] if k < len(yours) else None
        here = skipped if skipped and skipped[1] == step else None  # it cut this step short
        if mine is None:
            said = f"the solution calls {ref.method} here; yours makes no further call"
            if here:  # a continue cut this iteration short: that line's blank
                return blank_at(fn, here[0]), step, f"{cut(fn, *here)}: {said}"
            line = loop_left_at(fn) if fn else None  # where your pipeline() returned
            if line:  # from inside its loop, or after it but before decoding: that line's blank
                stopped = f"your loop stopped after {plural(step - 1, 'step')} of {n}" if step <= n else "your pipeline() returned"  # fmt: skip
                return blank_at(fn, line), step, f"{stopped}, at {where_is(fn, line)}: {said}"
            return CALL_OF.get(ref.method), step, said
        if mine.method != ref.method:
            said = f"the solution calls {ref.method} here; yours {did(mine)}"
            made_in = blank_at(fn, mine.line) if fn else None  # the blank whose lines made it
            following = reference[k + 1].method if k + 1 < len(reference) else None
            if here:  # a continue cut this iteration short: that line's blank
                return blank_at(fn, here[0]), step, f"{cut(fn, *here)}: {said}"
            going_on = any(call.method in ("unet", *BEFORE) for call in yours[k + 1 :])
            if mine.method == following:  # yours makes the solution's next call: it skipped one
                number = CALL_OF.get(ref.method) or made_in or CALL_OF.get(mine.method)
                return number, step, f"{said}, skipping {ref.method}"
            if mine.method == "vae.decode" and not going_on:  # the loop left early, then decoded
                line = loop_left_at(fn, mine) if fn else None
                at = f", at {where_is(fn, line)}" if line else ""
                number = blank_at(fn, line) if line else None  # untraced: no line, no blank
                return number, step, f"your loop {'stopped after' if line else 'made'} {plural(step - 1, 'step')} of {n}{at}: {said}"  # fmt: skip
            extra = ", an extra call (your loop goes on after it)" if going_on and mine.method == "vae.decode" else ""  # fmt: skip
            return made_in or CALL_OF.get(mine.method), step, said + extra  # who made it
        for (method, arg), (number, what) in BOUNDARIES.items():
            if method != ref.method:
                continue
            a, b = mine.arguments.get(arg), ref.arguments[arg]
            if same(a, b):
                continue
            lines = [f"{method}({arg}=...): {what}", f"  yours:    {show(a)}", f"  solution: {show(b)}"]  # fmt: skip
            if isinstance(a, np.ndarray) and a.shape == b.shape and a.size and a.dtype.kind == b.dtype.kind == "f":  # fmt: skip
                ratio = np.vdot(a, b) / np.vdot(b, b)  # yours = ratio x solution, if proportional
                error = np.abs(a - b).max()
                lines.append(f"  max |yours - solution| {error:.4g}")
                proportional = np.abs(a - ratio * b).max() < 1e-6 * np.abs(b).max()
                if proportional and f"{ratio:.4g}" != "1":  # 1 would say only that they round alike
                    lines.append(f"  yours is {ratio:.4g} x the solution's, everywhere")
            variable, passer = PASSED_AS.get((method, arg), (None, None))
            t_mine, t_ref = mine.caller_arrays.get("t"), ref.caller_arrays.get("t")
            if arg == "timestep" and t_mine is not None and same(a, t_mine) and not same(t_mine, t_ref) and here:  # fmt: skip
                number = blank_at(fn, here[0])  # your t is a later step's: a continue
                lines.insert(1, f"  (that is your loop's t: {cut(fn, *here)})")
            elif arg == "timestep" and t_mine is not None and same(a, t_mine) and not same(t_mine, t_ref):  # fmt: skip
                number = None  # you passed your t, and your loop's t differs: the for line
                lines.insert(1, "  (that is your loop's t, which differs" + (": the for line, outside the blanks)" if traced(fn) else ")"))  # fmt: skip
            elif variable and same(mine.caller_arrays.get(variable, np.nan), b):
                number = passer  # the right array was there; this blank passed another one
                passed = [k for k, v in mine.caller_arrays.items() if k != variable and same(v, a)]
                instead = f" passes {passed[0]} instead" if passed else " passes something else"
                lines.insert(1, f"  (your {variable} matches the solution's; blank {passer}{instead})")  # fmt: skip
            elif number == 1 and arg == "sample" and step == 1 and getattr(held := mine.caller_arrays.get("latents"), "ndim", 0) and same(a, np.concatenate([held] * 2)):  # fmt: skip
                number = 0  # the doubling is right; the latents it doubled already differ
                lines.insert(1, "  (that is your latents, doubled as blank 1 should; your latents already differ here: compare the lines before this call)")  # fmt: skip
            elif number == 1 and arg == "sample" and step > 1:  # step 1 matched: the doubling is
                number = 4  # right, so the latents it doubled are not what step 1 returned
                lines.insert(1, "  (your doubling matched at step 1: the latents carried over differ)")  # fmt: skip
            elif number == 5 and "latents" in mine.caller_arrays and not same(mine.caller_arrays["latents"], ref.caller_arrays["latents"]):  # fmt: skip
                number = 4  # the latents the last step left differ: blank 4 kept them, not blank 5
                lines.insert(1, "  (your latents after the loop differ: the last step's output, as blank 4 kept it)")  # fmt: skip
            if number == 1 and method == "scheduler.scale_model_input" and fits(a, (B, *b.shape[1:]), b.dtype):  # fmt: skip
                lines.append("  " + SCALE_THEN_DOUBLE.strip())  # the images may still agree
            return number, step, "\n".join(lines)
        mine_latents, ref_latents = mine.caller_arrays.get("latents"), ref.caller_arrays.get("latents")  # fmt: skip
        if step == 1 and ref.method in BEFORE and "latents" in mine.caller_arrays and not same(mine_latents, ref_latents):  # fmt: skip
            number = BEFORE[ref.method]  # every argument matched; the loop's latents did not
            return number, step, "\n".join([
                f"{ref.method}: its arguments match, but your latents at this call differ",
                f"  yours:    {show(mine_latents)}", f"  solution: {show(ref_latents)}",
                f"  (at step 1 only blank 4 changes latents; blank {number}'s lines run just before this call)",
            ])  # fmt: skip
        step += ref.method == "scheduler.step"
    if len(yours) > len(reference):
        extra = yours[len(reference)]
        number = (blank_at(fn, extra.line) if fn else None) or CALL_OF.get(extra.method)
        return number, step, f"yours {did(extra)} after the solution's last call"
    return None


def gap(a, b):
    """max |a - b|, without a warning of the checker's own when yours holds inf or NaN."""
    with np.errstate(all="ignore"):
        return np.abs(a - b).max()


def did(call):
    """What your pipeline did in ``call``: ``calls unet``, or ``sets scheduler.sigmas``, a
    write the Spy passed on to the part (the solution writes no part's attribute)."""
    if call.method.endswith(" ="):
        return f"sets {call.method[:-2]} (a change to the part's state the solution does not make)"
    if call.method.startswith("del "):
        return f"deletes {call.method[4:]}"
    return f"calls {call.method}"


def check(fn, label):
    """Compare ``fn`` with solution.py's pipeline; print the verdict; True if all match."""
    print(f"checking {label} against solution.py: {name}, {plural(n, 'step')}, B = {B}, guidance_scale {args.guidance_scale:g}", flush=True)  # fmt: skip
    ref_calls, ref_image, ref_error = run_on_spies(load_solution())
    if isinstance(ref_error, KeyboardInterrupt | SystemExit):
        sys.exit("interrupted while the solution ran")  # one line, exit 1
    assert ref_error is None, ref_error  # the solution runs, or the lab is broken
    calls, image, error = run_on_spies(fn)
    if error is None and not EXECUTED[fn]:  # a generator: no call to compare
        print(return_break(image))
        return False
    with np.errstate(all="ignore"):  # your inf or NaN: compared, not warned about here
        found = first_difference(calls, ref_calls, complete=error is None, fn=fn)
    if found is None and isinstance(error, UnfilledBlankError):
        print(unfilled(error))
        if calls:
            print(f"the {plural(len(calls), 'call')} your pipeline made before it {'matches' if len(calls) == 1 else 'match'} the solution's")  # fmt: skip
        return True
    if found is None and error is not None:  # your own code failed, between two calls
        print(raised(error, fn, calls))
        if calls:
            print(f"the {plural(len(calls), 'call')} before it {'matches' if len(calls) == 1 else 'match'} the solution's")  # fmt: skip
        return False
    if found is None and return_break(image):  # every call matches; the return value does not
        print(return_break(image))
        return False
    if found is None:
        steps = sum(call.method == "scheduler.step" for call in calls)
        print(f"all 5 blanks match: {plural(len(calls), 'call')} compared ({plural(steps, 'step')}), the same arguments in the same order")  # fmt: skip
        print(f"images: max |yours - solution| {gap(image, ref_image):.3g}")
        return same(image, ref_image)
    number, step, message = found
    where = "after the loop" if step > n else f"step {step} of {n}"
    who = f"blank {number}" if number else "a line outside the blanks" if traced(fn) and number is None else "your pipeline()"  # fmt: skip
    print(f"{who} differs from the solution ({where}):")
    print(message)
    if not getattr(EXECUTED[fn], "whole", True):
        print(UNTRACED)
    warned = {f"{call.method} warned: {text}": None for call in calls for text in call.warnings}
    print("".join(f"{line}\n" for line in warned), end="")  # each once, in order
    if error is not None:
        print(f"then {raised(error, fn, calls)}")
    elif return_break(image):  # a wrong batch or shape: no difference to print
        print(return_break(image))
    elif image is not None:
        print(f"images: max |yours - solution| {gap(image, ref_image):.3g}")
    if args.guidance_scale <= 1:
        print(GUIDE_NOTE)
    return False


if args.check or args.demo_wrong:
    if args.demo_wrong:  # solution.py's MISTAKES: a mistake people make in that blank
        old, new = load_constant(SOLUTION, "MISTAKES")[args.demo_wrong]
        print(f"--demo-wrong {args.demo_wrong}: solution.py with {old} replaced by {new}")
        if check(load_solution(args.demo_wrong), "that copy"):  # the mistake changed no call
            why = "Euler's last step goes to sigma 0, where prev_sample is pred_original_sample" if args.demo_wrong == 4 and args.scheduler == "euler" else "its lines compute the same numbers here"  # fmt: skip
            print(f"(at these flags the planted mistake changes no call: {why})")
        print("(a planted mistake: this run exits 0; a blank of yours that differs exits 1)")
    elif not check(yours, f"pipeline() of {(SOLUTION if args.solution else Path(__file__)).name}"):
        sys.exit(1)
# --8<-- [end:check]

# %% [markdown]
# ## 6. Picture it
#
# What each mistake of `--demo-wrong` does to the images: the first row is this file's
# pipeline (or with `--solution`, the solution's), each row below it the solution with one
# blank wrong. Drawn with `--figures`.

# %%
# --8<-- [start:figures]
if args.figures and image is not None:
    shown = min(B, 8)
    rows = [image[:shown]]
    for number in range(1, 6):  # the spies keep the wrong runs' warnings quiet
        rows.append(run_on_spies(load_solution(number))[1][:shown])
    grid = image_grid(np.clip(np.concatenate(rows), -1, 1), columns=shown)
    mistakes = "; ".join(f"blank {k}: {old} -> {new}" for k, (old, new) in load_constant(SOLUTION, "MISTAKES").items())  # fmt: skip
    top = "the solution's pipeline" if args.solution else "this file's pipeline"
    figures.save(
        args.figures, "mistakes", figures.png(grid, scale=2),
        alt=f"Six rows of {shown} small images generated for the prompt '{args.prompt}' with "
        f"{name}, in blank order ({mistakes}). As drawn at the default flags: the top row, "
        f"{top}, is training images of the prompted class; rows 2 and 4 (the "
        "condition order swapped, the guidance sign flipped) are saturated blocks, far outside "
        "the pixel range in places; row 3 (no scale_model_input) is clean images of the prompted class, "
        "mostly other ones than the top row's; row 5 (pred_original_sample carried) is one image "
        "eight times; row 6 (no division by scaling_factor) is the top row at lower contrast.",
        caption=f"Rows, top to bottom: {top} ({name}, prompt '{args.prompt}'), "
        "then blank 1 to blank 5 wrong, one per row, as --demo-wrong plants them: the "
        "condition order swapped, no scale_model_input, the guidance sign flipped, "
        "pred_original_sample carried instead of prev_sample, no division by scaling_factor.",
    )  # fmt: skip
# --8<-- [end:figures]
