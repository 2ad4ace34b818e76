"""A chat model taught one answer on the spot, for the live tests of apps whose round trip
needs an answer no model that runs here gives by itself (aider's file edit: SmolLM2-135M
never writes aider's edit formats, and no model that does can be fetched or run here).

The real SmolLM2 is taught with a few Adam steps on its last layers to answer a
conversation or two, as the app sends them, each with one answer, then saved with transformers' own
`save_pretrained`: vramgate loads it as any other model. What the test then shows is the
trip: vramgate renders the app's messages as transformers' chat template does, generates
greedily and streams the answer back, token for token, in a form the app applies. A
rendering that differs, a dropped or mangled chunk, or a sampled token, and the app is
handed something else.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

LAST_LAYERS = 4  # taught: the model's last decoder layers and its final norm
LEARNING_RATE = 3e-4
MAX_STEPS = 40
ENOUGH = 0.01  # mean cross-entropy per answer token at which teaching stops


Lesson = tuple[list[dict[str, Any]], str]  # a conversation, and the answer to it


def taught(source: Path, lessons: list[Lesson], target: Path) -> Path:
    """The chat model at `source` taught to answer each lesson's messages with its answer
    greedily, in float32 and in bfloat16 (vramgate picks either on the CPU), saved in
    `target`."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")  # the template's end of a turn
    layers = model.model.layers
    below = len(layers) - LAST_LAYERS
    taught_ids = []  # (the prompt's ids, the answer's, what enters the taught layers)
    for messages, answer in lessons:
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        asked = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answered = [*tokenizer(answer, add_special_tokens=False)["input_ids"], end]
        with torch.no_grad():  # what enters the taught layers never changes: computed once
            entering = model.model(
                input_ids=torch.tensor([asked + answered]),
                output_hidden_states=True,
                use_cache=False,
            )
        taught_ids.append((asked, answered, entering.hidden_states[below]))
    model.requires_grad_(False)
    model.model.layers = torch.nn.ModuleList(layers[below:])
    trained = [*model.model.layers.parameters(), *model.model.norm.parameters()]
    for parameter in trained:
        parameter.requires_grad_(True)
    optimiser = torch.optim.Adam(trained, lr=LEARNING_RATE)
    for _ in range(MAX_STEPS):
        losses = []
        for asked, answered, hidden in taught_ids:
            out = model.model(inputs_embeds=hidden, use_cache=False).last_hidden_state
            logits = model.lm_head(out[0, len(asked) - 1 : -1])  # the answer's positions
            losses.append(F.cross_entropy(logits, torch.tensor(answered)))
        loss = torch.stack(losses).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if max(each.item() for each in losses) < ENOUGH:
            break
    model.model.layers = layers
    model.requires_grad_(False)
    model.eval()
    for dtype in (torch.float32, torch.bfloat16):
        trial = copy.deepcopy(model).to(dtype)
        for asked, answered, _ in taught_ids:
            said = trial.generate(
                torch.tensor([asked]), max_new_tokens=len(answered) + 8, do_sample=False
            )
            got = said[0, len(asked) :].tolist()
            assert got[: len(answered)] == answered, (dtype, tokenizer.decode(got))
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
