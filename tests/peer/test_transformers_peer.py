"""transformers' own common model tests (its ``ModelTesterMixin`` and ``ConfigTester``, from the sdist of the installed
transformers: tests/peer/hf_suite.py) on 12 decoder families (tests/peer/families.py), twice: with transformers' own
attention (``Test<Family>Theirs``: the reference, every test selected must pass) and with every model the tests build
switched to easy_context's attention (``Test<Family>Ours``: ``apply_seq_parallel_monkey_patch("data_parallel",
model_type, always=True)``, which switches each model of that type at the end of its construction). gpt-oss runs once
more switched by instance, each model at the end of its construction, sub-models first (``Test<Family>OursInnerFirst``:
a harness that switches every ``PreTrainedModel`` it sees): its tree must keep one config, which
``set_experts_implementation`` and config edits go through.

A test that passes with transformers' attention passes with ours, or stands in EXPECTED_FAILURES (a strict xfail:
tests/peer/conftest.py) with a reason that docs/limits.md gives. NOT_RUN lists the mixin's tests this suite does not
run, each with why.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import unittest
from fnmatch import fnmatch
from unittest import mock

import torch
from transformers import PretrainedConfig, PreTrainedModel

from easy_context.hf import patch as hf_patch
from easy_context.hf.attention import attention_calls
from tests.peer import hf_suite
from tests.peer.families import FAMILIES, DecoderTester

HF = hf_suite.load()

# The mixin's tests this suite runs (fnmatch patterns): those whose models attend (masks, padding, batching, sliding
# windows, attention weights, hidden states), train (gradients, gradient checkpointing), compute the loss, generate or
# choose the attention implementation. EC_PEER_ALL=1 runs every test of the mixin.
RUN = (
    "test_config", "test_attention_that_runs", "test_*generate*", "test_bc_cache_name_forward",
    "test_eager_matches_sdpa_inference_*_fp32_pad_*", "test_eager_matches_sdpa_inference_*_bf16_pad_right_no_attn_mask",
    "test_attention_outputs", "test_sliding_window_mask", "test_batching_equivalence", "test_determinism",
    "test_hidden_states_output", "test_retain_grad_hidden_states_attentions", "test_inputs_embeds*",
    "test_model_forward_default_config_values", "test_training*", "test_enable_input_require_grads_with_*",
    "test_causal_lm_loss_honors_shift_labels", "test_save_load", "test_sdpa_can_dispatch_non_composite_models",
    "test_can_set_attention_dynamically", "test_config_attn_implementation_setter", "test_model_rope_scaling_*",
    "test_eager_matches_batched_and_grouped_inference_*",
)  # fmt: skip
# Why the others are not run, first match wins
NOT_RUN = {
    "*_sdpa_kernels": "toggles the SDPA backends of transformers' sdpa path: on CPU the variant without it again",
    "test_eager_matches_sdpa_inference_*": "half precision on CPU repeats the fp32 comparisons at looser tolerances",
    "test_*": "model plumbing that the attention function never changes (weights saved, loaded, initialised, tied, "
    "resized; output capture; dtype, device and parallel plans): the same code under either attention",
}

# Tests that pass with transformers' attention and fail with easy_context's ("family::test" fnmatch patterns), and why
# (docs/limits.md, "transformers' own tests").
EXPECTED_FAILURES: dict[str, str] = {
    "*::test_sdpa_can_dispatch_non_composite_models": "loads a model without attn_implementation and expects 'sdpa': "
    "a model type switched with apply_seq_parallel_monkey_patch is easy_context's then (what the type patch is for; "
    "an explicit attn_implementation= on one process is kept)",
}


class PeerCase:
    """What both runs of a family share: the tester, the config tester, and a check of which attention ran."""

    family = None
    attention = None  # "theirs" or "ours"

    def setUp(self):
        self.model_tester = DecoderTester(self, self.family, HF.modeling.ids_tensor)
        self.config_tester = HF.configuration.ConfigTester(self, config_class=self.model_tester.config_class)
        self.all_model_classes = self.model_tester.all_model_classes

    @contextlib.contextmanager
    def subTest(self, msg=None, **params):
        # a failing subtest fails its test: pytest reports subtests beside a passing test, which neither the strict
        # expected failures nor the pass/fail table could see
        yield

    def test_config(self):
        if "can_init_without_params" in inspect.signature(self.config_tester.run_common_tests).parameters:
            self.config_tester.run_common_tests(can_init_without_params=self.family.config_inits_quietly)
        else:  # older transformers (5.17): the no-argument check only fails on a config that cannot build at all
            self.config_tester.run_common_tests()

    def test_attention_that_runs(self):
        """The models this case builds attend through transformers' attention ('theirs') or easy_context's ('ours')."""
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        for model_class in self.all_model_classes:
            model = model_class(config).eval()
            before = attention_calls()
            with torch.no_grad():
                model(input_ids=inputs["input_ids"])
            if self.attention == "ours":
                self.assertTrue(model.config._attn_implementation.startswith("easy_context_data_parallel"))
                self.assertEqual(attention_calls() - before, config.num_hidden_layers)
                configs = [getattr(m, "config", None) for m in model.modules()]
                held = {id(c) for c in configs if isinstance(c, PretrainedConfig)}
                self.assertEqual(held, {id(model.config)})  # one config for the whole model, as transformers gives
            else:
                self.assertIn(model.config._attn_implementation, ("sdpa", "eager"))  # Gemma 2: eager
                self.assertEqual(attention_calls(), before)


class OursCase(PeerCase):
    """Every model of the family's type built during a test is switched to easy_context's attention."""

    attention = "ours"

    def setUp(self):
        super().setUp()
        patches = mock.patch.dict(hf_patch._TYPE_PATCHES)  # restored after the test, whatever it switched
        patches.start()
        self.addCleanup(patches.stop)
        hf_patch.apply_seq_parallel_monkey_patch("data_parallel", self.model_tester.config_class.model_type,
                                                 always=True, kernel="auto")  # fmt: skip

    def reference_attention(self):
        return mock.patch.dict(hf_patch._TYPE_PATCHES, clear=True)


class TheirsCase(PeerCase):
    attention = "theirs"


class OursAllOnesCase(OursCase):
    """As OursCase with all-ones attention masks: on one process a padding mask sends a forward to the model's own
    attention, so here every forward of the tests runs easy_context's (the table counts which did)."""

    padded = False
    label = "OursAllOnes"


class OursInnerFirstCase(PeerCase):
    """Every model of the family's type is switched by instance (``apply_seq_parallel_monkey_patch("data_parallel",
    model, always=True)``) at the end of its construction, so a causal LM's decoder before the LM itself: a harness
    that switches each ``PreTrainedModel`` it sees (or a head's backbone switched, then the whole model). As the
    data_parallel type patch does, a model whose construction asked for an attention by name keeps it. All-ones masks:
    every forward runs easy_context's attention."""

    attention = "ours"
    padded = False
    label = "OursInnerFirst"

    def setUp(self):
        super().setUp()
        model_type = self.model_tester.config_class.model_type
        init, post_init = PreTrainedModel.__init__, PreTrainedModel.post_init
        asked: list[object] = []  # per model under construction: the attention its outermost construction asked for
        self._harness = True

        def __init__(model, config, *args, **kwargs):
            asked.append(asked[-1] if asked else getattr(config, "_attn_implementation_internal", None))
            init(model, config, *args, **kwargs)

        def switching_post_init(model, *args, **kwargs):
            post_init(model, *args, **kwargs)
            requested, shared = asked.pop() if asked else None, model.config
            if self._harness and requested is None and shared.model_type == model_type:
                hf_patch.apply_seq_parallel_monkey_patch("data_parallel", model, always=True, kernel="auto")
                shared._attn_implementation_internal = None  # the next model built from it asks for nothing either

        for name, fn in (("__init__", __init__), ("post_init", switching_post_init)):
            patcher = mock.patch.object(PreTrainedModel, name, fn)
            patcher.start()
            self.addCleanup(patcher.stop)
        types = mock.patch.dict(hf_patch._TYPE_PATCHES, clear=True)  # the harness alone switches
        types.start()
        self.addCleanup(types.stop)

    @contextlib.contextmanager
    def reference_attention(self):
        self._harness = False
        try:
            yield
        finally:
            self._harness = True


# gpt-oss runs a fourth time switched inner-first: its experts read their implementation from the config
INNER_FIRST_FAMILIES = ("gpt_oss",)

# the families run a third time with all-ones masks: one per attention variant (plain GQA; soft-capping and windows;
# two RoPE bases and windows; sinks, windows and experts), which keeps make test within its time
ALL_ONES_FAMILIES = ("llama", "gemma2", "gemma3", "gpt_oss")


def _not_run(reason: str):
    @unittest.skip(reason)
    def test(self):
        pass

    return test


def _case(family, side: type) -> type:
    bases = (side, HF.modeling.ModelTesterMixin, HF.generation.GenerationTesterMixin, unittest.TestCase)
    label = getattr(side, "label", side.attention.title())
    name = f"Test{family.name.title().replace('_', '')}{label}"
    case = type(name, bases, {"family": family, "__module__": __name__})
    if os.environ.get("EC_PEER_ALL") == "1":
        return case
    for attr in dir(case):
        if not attr.startswith("test_") or any(fnmatch(attr, p) for p in RUN if not fnmatch(attr, "*_sdpa_kernels")):
            continue
        setattr(case, attr, _not_run(next(r for pattern, r in NOT_RUN.items() if fnmatch(attr, pattern))))
    return case


for _family in FAMILIES:
    for _side in (TheirsCase, OursCase, OursAllOnesCase, OursInnerFirstCase):
        if _side is OursAllOnesCase and _family.name not in ALL_ONES_FAMILIES:
            continue
        if _side is OursInnerFirstCase and _family.name not in INNER_FIRST_FAMILIES:
            continue
        _c = _case(_family, _side)
        globals()[_c.__name__] = _c
del _family, _side, _c
