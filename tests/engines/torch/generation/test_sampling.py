"""Sampling parameters: exact arithmetic on given logits, then their effect on the texts of
a real (small, randomly initialised) Llama generating in the batcher, where the expected
effect can be computed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from app.config.settings import ModelSpec
from app.devices.cpu import CpuDevice
from app.engines.torch.generation.causal_lm import CausalLMHandler
from app.engines.torch.generation.sampling import adjusted, sample
from app.models.decoding import SamplingParams
from tests.engines.torch.generation.test_step_batch import alone
from tests.support.random_models import save_random_llama

GREEDY = SamplingParams(temperature=0.0)


def test_logit_bias_is_added_to_the_named_tokens():
    logits = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = adjusted(logits, replace(GREEDY, logit_bias=((3, -100.0), (0, 5.0))))
    assert out.tolist() == [6.0, 2.0, 3.0, -96.0]
    assert logits.tolist() == [1.0, 2.0, 3.0, 4.0]  # the model's own logits untouched


def test_frequency_and_presence_penalties_follow_openais_formula():
    logits = torch.zeros(5)
    params = replace(GREEDY, frequency_penalty=0.5, presence_penalty=1.0)
    out = adjusted(logits, params, produced=[1, 1, 1, 3], prompt=[2, 2])
    # minus count x frequency, minus presence once; the prompt does not count
    assert out.tolist() == [0.0, -2.5, 0.0, -1.5, 0.0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([2.0, -2.0, 2.0, -2.0])
    out = adjusted(logits, replace(GREEDY, repetition_penalty=2.0), produced=[0], prompt=[1])
    assert out.tolist() == [1.0, -4.0, 2.0, -2.0]  # prompt and answer tokens; others as were


@pytest.mark.parametrize("seed", range(5))
def test_top_k_1_and_min_p_1_leave_only_the_most_likely_token(seed):
    logits = torch.randn(100, generator=torch.Generator().manual_seed(seed))
    best = int(torch.argmax(logits))
    for params in (SamplingParams(temperature=1.5, top_k=1), SamplingParams(min_p=1.0)):
        generator = torch.Generator().manual_seed(seed)
        assert {sample(logits, params, generator) for _ in range(20)} == {best}


def test_top_k_draws_only_among_the_k_most_likely():
    logits = torch.arange(50, dtype=torch.float32)  # 49 is the most likely
    generator = torch.Generator().manual_seed(0)
    drawn = {
        sample(logits, SamplingParams(temperature=5.0, top_k=3), generator) for _ in range(300)
    }
    assert drawn == {47, 48, 49}


@pytest.fixture(scope="module")
def handler(tmp_path_factory) -> Iterator[CausalLMHandler]:
    folder = save_random_llama(tmp_path_factory.mktemp("tiny-llama"), context=1024)
    handler = CausalLMHandler(ModelSpec(name="tiny", kind="generation", path=folder))
    handler.load(CpuDevice())
    yield handler
    handler.unload()


def token_ids(handler: CausalLMHandler, text: str) -> list[int]:
    return list(handler._tokenizer(text, add_special_tokens=False)["input_ids"])


def test_a_logit_bias_of_minus_100_on_the_greedy_token_removes_it(handler):
    prompt = "once upon a time"
    first = token_ids(handler, alone(handler, prompt, 1).text)
    assert first, "the greedy first token decodes to nothing"
    biased = alone(handler, prompt, 1, logit_bias=((first[0], -100.0),)).text
    assert biased != alone(handler, prompt, 1).text


def test_a_presence_penalty_stops_a_random_model_repeating_itself(handler):
    prompt = "the the the the"

    def repeats(text: str) -> int:
        ids = token_ids(handler, text)
        return len(ids) - len(set(ids))

    plain = alone(handler, prompt, 40).text
    penalised = alone(handler, prompt, 40, presence_penalty=2.0, frequency_penalty=2.0).text
    assert repeats(plain) > 0, "the unpenalised random model never repeated a token"
    assert repeats(penalised) < repeats(plain)


def test_an_out_of_vocabulary_logit_bias_is_a_400_before_anything_runs(handler):
    from app.errors import InvalidRequest

    before = handler.forward_calls
    with pytest.raises(InvalidRequest) as refused:
        handler.prepare_generation("hi", replace(GREEDY, logit_bias=((10**7, 1.0),)), 4)
    assert refused.value.param == "logit_bias"
    assert handler.forward_calls == before


def test_greedy_tokens_come_with_their_log_probability_and_the_likeliest_others(handler):
    result = alone(handler, "once upon a time", 12, logprobs=3)
    assert result.logprobs is not None and len(result.logprobs) == result.completion_tokens
    for entry in result.logprobs:
        values = [value for _, value in entry.top]
        assert len(entry.top) == 3 and values == sorted(values, reverse=True)
        assert entry.logprob == pytest.approx(values[0])  # greedy: the likeliest token
        assert entry.token == entry.top[0][0]
        assert sum(torch.tensor(values).exp()) <= 1.0 + 1e-5
    assert alone(handler, "once upon a time", 4).logprobs is None  # only when asked
