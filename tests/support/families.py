"""Tiny models of today's chat-template families, made on the spot: a random Llama of
`random_models` with a tokenizer that has the family's own tokens (its control tokens
special, its tags — `<think>`, `<tool_call>` — added as text the answer carries, as
the real tokenizers have them) and the family's real chat template
(tests/support/templates, README there: where each comes from), taught a few answers
to a few conversations as the template renders them (`Lesson`), then saved with
transformers' own `save_pretrained` and written as a GGUF with llama.cpp's converter's
layout (`random_models.save_random_llama_gguf`), so both engines load the same model.

A random model's free text is noise; a taught one says the lesson's answer greedily,
token for token, so a test can ask for thinking, an answer and a tool call in the
family's own format and see what every API makes of it on both engines. Teaching is
all of a 64-wide, two-layer model's weights with Adam (a second or two on a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.random_models import CORPUS, save_random_llama_gguf

TEMPLATES = Path(__file__).parent / "templates"
LEARNING_RATE = 1e-2
MAX_STEPS = 600
MARGIN = 4.0  # logits by which each taught token must lead: greedy on either engine


@dataclass(frozen=True)
class Family:
    """A family's chat template (a file in TEMPLATES) and the tokens its answers and
    prompts are written with."""

    name: str
    template: str
    special: tuple[str, ...]  # control tokens: the template's turn markers
    added: tuple[str, ...]  # tags the answer's text carries (not special: decoded)
    eos: str
    bos: str | None = None
    stops: tuple[str, ...] = ()  # other tokens that end an answer (harmony's `<|call|>`)
    think_open: str = "<think>"  # where a thought starts, and how a spent budget ends it
    budget_close: str = "</think>"

    def chat_template(self) -> str:
        return (TEMPLATES / self.template).read_text()


QWEN3 = Family(
    "qwen3",
    "Qwen-Qwen3-0.6B.jinja",
    ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
    ("<think>", "</think>", "<tool_call>", "</tool_call>"),
    eos="<|im_end|>",
)
R1_DISTILL = Family(
    "r1-distill",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"),
    # its call block's markers, as text the answer carries (llama.cpp keeps them too: its
    # R1 handler's preserved_tokens)
    (
        "<think>",
        "</think>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
    ),
    eos="<｜end▁of▁sentence｜>",
    bos="<｜begin▁of▁sentence｜>",
)

LLAMA3 = Family(
    "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ),
    (),
    eos="<|eot_id|>",
    bos="<|begin_of_text|>",
)
MISTRAL_NEMO = Family(
    "mistral-nemo",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    (
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
    ),
    (),
    eos="</s>",
    bos="<s>",
)
# gpt-oss: harmony's markers are control tokens, as in its o200k_harmony tokenizer; an
# answer ends with `<|return|>` (its eos) or `<|call|>`
GPT_OSS = Family(
    "gpt-oss",
    "openai-gpt-oss-120b.jinja",
    (
        "<|endoftext|>",
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|constrain|>",
        "<|return|>",
        "<|call|>",
    ),
    (),
    eos="<|return|>",
    stops=("<|call|>",),
    think_open="<|channel|>analysis<|message|>",
    budget_close="<|end|><|start|>assistant<|channel|>final<|message|>",
)


@dataclass(frozen=True)
class Lesson:
    """A conversation (its tools and template switches too) and the answer to it.
    `budget`: also taught, how the answer goes on after its thinking was closed once
    `budget` tokens of it were written (`after_budget`), as an engine closes it.
    `closed`: the prompt's opened thinking block closed, as the server closes it to turn
    thinking off where the template has no switch (app.models.chat.reasoning)."""

    messages: list[dict[str, Any]]
    answer: str
    tools: list[dict[str, Any]] | None = None
    switches: dict[str, Any] = field(default_factory=dict)
    budget: int | None = None
    after_budget: str = ""
    closed: bool = False


def save_family_model(folder: Path, family: Family, lessons: list[Lesson]) -> Path:
    """A tiny model of `family` taught `lessons`, saved in `folder` (safetensors) and as
    `folder.gguf` beside it; the folder is returned."""
    import torch

    tokenizer = _tokenizer(family, lessons)
    tokenizer.save_pretrained(folder)
    model = _random_llama(tokenizer)
    stops = [tokenizer.convert_tokens_to_ids(stop) for stop in family.stops]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *stops]
    taught = [seq for lesson in lessons for seq in _sequences(tokenizer, family, lesson)]
    _teach(model, taught)
    for asked, answered, given in taught:  # greedily, each answer token for token
        before = asked + answered[:given]
        with torch.no_grad():
            said = model.generate(
                torch.tensor([before]),
                max_new_tokens=len(answered) - given,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=model.generation_config.eos_token_id,
            )
        assert said[0, len(before) :].tolist() == answered[given:], tokenizer.decode(answered)
    model.save_pretrained(folder)
    save_random_llama_gguf(folder, folder.with_suffix(".gguf"))
    return folder


def tokens_of(folder: Path, text: str) -> list[int]:
    """`text`'s token ids in the model's own tokenizer (how long a thought was)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _tokenizer(family: Family, lessons: list[Lesson]) -> Any:
    """A byte-level BPE trained on the corpus and the lessons' answers, with the family's
    control tokens (special) and tags (added, not special) and its chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=list(family.special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator([*CORPUS, *(lesson.answer for lesson in lessons)], trainer)
    bpe.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in family.added])
    pad = family.special[0]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token=family.bos, eos_token=family.eos, pad_token=pad
    )
    tokenizer.chat_template = family.chat_template()
    return tokenizer


def _random_llama(tokenizer: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


Taught = tuple[list[int], list[int], int]  # prompt ids, answer ids, answer ids given


def _sequences(tokenizer: Any, family: Family, lesson: Lesson) -> list[Taught]:
    """What a lesson teaches: the prompt as its template renders it (the tools as the
    server gives them: app.models.tools.chat_messages) and the answer (its end of turn
    after it, where it does not end in one of the family's stops); with a budget, also
    the answer cut after that many thinking tokens, closed as an engine closes it
    (`Family.budget_close`), and `after_budget` (only that last part taught)."""
    from app.models.tools import chat_messages, template_knows_tools

    knows = template_knows_tools(tokenizer.chat_template)  # else in the system message
    prompt = tokenizer.apply_chat_template(
        chat_messages(lesson.messages, lesson.tools, knows),
        tools=lesson.tools if knows else None,
        add_generation_prompt=True,
        tokenize=False,
        **lesson.switches,
    )
    prompt += "</think>\n\n" if lesson.closed else ""
    asked = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    end = tokenizer.convert_tokens_to_ids(family.eos)
    stops = {end, *(tokenizer.convert_tokens_to_ids(stop) for stop in family.stops)}
    answer = tokenizer(lesson.answer, add_special_tokens=False)["input_ids"]
    ended = bool(answer) and answer[-1] in stops
    taught: list[Taught] = [(asked, answer if ended else [*answer, end], 0)]
    if lesson.budget is not None:
        opened = prompt.rstrip().endswith(family.think_open)
        start = 0 if opened else _after(answer, _ids(tokenizer, family.think_open))
        closing = _ids(tokenizer, family.budget_close)
        closed = [*answer[: start + lesson.budget], *closing]
        after = tokenizer(lesson.after_budget, add_special_tokens=False)["input_ids"]
        taught.append((asked, [*closed, *after, end], len(closed)))
    return taught


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _after(ids: list[int], tag: list[int]) -> int:
    """Where the first `tag` in `ids` ends."""
    for at in range(len(ids) - len(tag) + 1):
        if ids[at : at + len(tag)] == tag:
            return at + len(tag)
    raise ValueError("the answer has no thought to cut")


def _teach(model: Any, taught: list[Taught]) -> None:
    """All the model's weights, the lessons in one padded batch, until each answer's
    tokens (past what is given) are its greedy choice by a wide margin."""
    import torch
    import torch.nn.functional as F

    width = max(len(asked) + len(answered) for asked, answered, _ in taught)
    ids = torch.zeros((len(taught), width), dtype=torch.long)
    mask = torch.zeros((len(taught), width), dtype=torch.long)
    labels = torch.full((len(taught), width), -100)  # what each position is taught to say
    for row, (asked, answered, given) in enumerate(taught):
        whole = asked + answered
        ids[row, : len(whole)] = torch.tensor(whole)
        mask[row, : len(whole)] = 1
        start = len(asked) + given
        labels[row, start - 1 : len(whole) - 1] = torch.tensor(answered[given:])
    optimiser = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    model.train()
    taught_at = labels != -100
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's steps: 8x faster on one thread than on two busy ones
    try:
        for step in range(MAX_STEPS):
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            if step % 10 == 9 and _learnt(logits.detach()[taught_at], labels[taught_at]):
                break
    finally:
        torch.set_num_threads(threads)
    model.eval()


def _learnt(logits: Any, wanted: Any) -> bool:
    """Whether every taught token leads the next likeliest by MARGIN logits."""
    chosen = logits.gather(1, wanted[:, None])[:, 0]
    others = logits.scatter(1, wanted[:, None], float("-inf")).max(dim=1).values
    return bool((chosen - others).min() > MARGIN)
