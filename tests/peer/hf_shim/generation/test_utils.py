"""Stands in for transformers' ``tests/generation/test_utils.py`` (not in the sdist): our own ``generate()`` checks.

Each builds a model of every generative class of the family as the test case builds models (switched to easy_context's
attention in the 'ours' cases), and compares its greedy ``generate()`` with greedy decoding of the same weights under
transformers' eager attention, one full forward per new token (no cache): one prompt per row (with and without the
KV cache) and a left-padded batch (what a batched ``generate()`` builds) against each prompt alone.
"""

from __future__ import annotations

import contextlib
import copy

import torch

MAX_NEW_TOKENS = 4


def greedy_without_cache(model: torch.nn.Module, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """``input_ids`` followed by ``new_tokens`` argmax tokens, each from a full forward over the sequence so far."""
    ids = input_ids
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(input_ids=ids, use_cache=False).logits[:, -1]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids


class GenerationTesterMixin:
    def reference_attention(self):
        """A context in which the models built are not switched to easy_context's attention (the 'ours' cases
        override it)."""
        return contextlib.nullcontext()

    def _generative_models(self):
        config, inputs = self.model_tester.prepare_config_and_inputs_for_common()
        classes = self.all_generative_model_classes
        self.assertTrue(classes, "the family's tester lists no class that can generate")
        for model_class in classes:
            torch.manual_seed(0)
            model = model_class(config).eval()
            model.generation_config.eos_token_id = None  # always MAX_NEW_TOKENS tokens, as the reference makes
            model.generation_config.pad_token_id = config.pad_token_id
            attention = model.config._attn_implementation
            with self.reference_attention():  # its own config: a model's attention setting lives on its config
                reference = model_class._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
            reference.load_state_dict(model.state_dict())
            self.assertEqual(reference.config._attn_implementation, "eager")
            self.assertEqual(model.config._attn_implementation, attention)
            yield model, reference, inputs["input_ids"]

    def _generate(self, model, input_ids, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(input_ids, do_sample=False, max_new_tokens=MAX_NEW_TOKENS, **kwargs)

    def test_greedy_generate_matches_transformers_attention(self):
        for model, reference, input_ids in self._generative_models():
            prompts = input_ids[:2]
            out = self._generate(model, prompts, attention_mask=torch.ones_like(prompts))
            torch.testing.assert_close(out, greedy_without_cache(reference, prompts, MAX_NEW_TOKENS), rtol=0, atol=0)

    def test_greedy_generate_without_cache_matches_transformers_attention(self):
        for model, reference, input_ids in self._generative_models():
            prompts = input_ids[:2]
            out = self._generate(model, prompts, attention_mask=torch.ones_like(prompts), use_cache=False)
            torch.testing.assert_close(out, greedy_without_cache(reference, prompts, MAX_NEW_TOKENS), rtol=0, atol=0)

    def test_left_padded_batch_generate_matches_each_prompt_alone(self):
        for model, reference, input_ids in self._generative_models():
            length = input_ids.shape[1]
            lengths = [length, length - 2, length - 4]
            pad = model.config.pad_token_id
            batch = torch.full((len(lengths), length), pad, dtype=input_ids.dtype)
            mask = torch.zeros_like(batch)
            for row, n in enumerate(lengths):
                batch[row, length - n :] = input_ids[row, :n]
                mask[row, length - n :] = 1
            out = self._generate(model, batch, attention_mask=mask)
            for row, n in enumerate(lengths):
                alone = greedy_without_cache(reference, input_ids[row : row + 1, :n], MAX_NEW_TOKENS)
                torch.testing.assert_close(out[row : row + 1, length - n :], alone, rtol=0, atol=0)
