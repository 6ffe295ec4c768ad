"""Planning a generation: a `GenerationSpec` over one model → the engine requests to submit.

Owns: compiling the output constraint (`response_format`, `grammar`, Ollama's `format`),
the tool setup (template input, the grammar of valid calls), rendering chat prompts with
the model's template, tokenizing (long texts off the event loop, in a traced span),
checking token ids against the vocabulary, resolving each prompt's token limit against
the context, and one `AddRequest` per choice: prompt p's choice j gets index p·n + j,
its own seed and the compiled constraint. Also the model-name check every dialect
answers with (`answer_model`). Raises before anything is queued: InvalidRequest (400),
ContextLengthExceeded (400), PermissionDenied (403), ModelNotFound (404).

Images (issue 28): a prompt's images are checked and probed (`api/images`) before it is
tokenized; the rendered text is split where each image's marker stands, the pieces are
tokenized one by one, and each image becomes an `ImageInput` at the token position it
goes before. The image's own tokens are the worker's to count (it knows the mmproj).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import anyio
import msgspec
from opentelemetry.trace import Tracer

from inferflux.api.generation.spec import (
    ChatPrompt,
    GenerationSpec,
    GrammarOutput,
    OutputSpec,
    Prompt,
    TextPrompt,
)
from inferflux.api.images import ImageSet, resolve_images
from inferflux.api.structured import OutputConstraint, grammar_constraint, schema_constraint
from inferflux.api.telemetry import tokenize_span
from inferflux.api.tools import ChatTools, plan_tools, tools_constraint
from inferflux.engine.chat_template import ChatTemplate
from inferflux.engine.grammar import ConstraintCompiler
from inferflux.engine.messages import AddRequest, ImageInput
from inferflux.engine.protocol import ModelInfo, Tokenizer
from inferflux.errors import ContextLengthExceeded, InvalidRequest, ModelNotFound
from inferflux.models.serving import ServingState
from inferflux.observability.metrics import Metrics
from inferflux.security.principal import Principal
from inferflux.security.rbac import authorize_model

_THREAD_TOKENIZE_CHARS = 16_384  # longer texts are tokenized off the event loop
_SEED_STRIDE = 0x9E3779B97F4A7C15  # choices' seeds: spread apart, reproducible
# a request nobody streams: its tokens reach the API process in chunks this far apart
# (stream_buffer.py), not a message per step; one wake-up of the API process per token
# cost the worker 5-7% of a single stream's tok/s (BENCHMARKS.md, "stream_interval")
COLLECT_HOLD_S = 0.25


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of a response: its `index`, the prompt it continues, its engine request."""

    index: int
    prompt_index: int
    request: AddRequest


class PlannedPrompt(NamedTuple):
    """A prompt's token ids and its images (each at the token position it goes before)."""

    token_ids: list[int]
    images: list[ImageInput] = []  # NOTE: never mutated


@dataclass(frozen=True, slots=True)
class GenerationPlan:
    """A planned request: its id, every choice, the constraint whose check each finished
    choice reports (None: free output) and the tool setup (None: no tools)."""

    response_id: str
    choices: list[Choice]
    output: OutputConstraint | None = None
    tools: ChatTools | None = None

    @property
    def calls_tools(self) -> bool:
        """True when the model may call a tool (its text is parsed for calls)."""
        return self.tools is not None and self.tools.plan is not None


def answer_model(requested: str | None, model_info: ModelInfo, principal: Principal) -> str:
    """The model id to answer with (an alias answers with the id); raises ModelNotFound
    for a name that is not this model's (the route's lease already resolved it) and
    PermissionDenied for one outside the caller's `allowed_models`."""
    if model_info.serves(requested) or model_info.serves((requested or "").removesuffix(":latest")):
        authorize_model(principal, *model_info.access_names())
        return model_info.model_id
    raise ModelNotFound(
        f"the model '{requested}' does not exist on this server (GET /v1/models lists the models)",
        param="model",
    )


def check_token_ids(token_ids: Sequence[int], n_vocab: int, param: str) -> None:
    for token_id in token_ids:
        if not 0 <= token_id < n_vocab:
            raise InvalidRequest(
                f"token id {token_id} is out of range: the vocabulary has {n_vocab} tokens",
                param=param,
            )


def resolve_max_tokens(
    num_prompt_tokens: int, requested: int | None, n_ctx: int, param: str
) -> int:
    """`requested`, or whatever the context leaves; raises ContextLengthExceeded."""
    max_tokens = requested if requested is not None else n_ctx - num_prompt_tokens
    if max_tokens < 1 or num_prompt_tokens + max_tokens > n_ctx:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {n_ctx} tokens, but {num_prompt_tokens} "
            f"prompt tokens + {max(max_tokens, 1)} completion tokens were requested; shorten "
            "the prompt or lower max_tokens",
            param=param,
        )
    return max_tokens


def derive_seed(seed: int | None, choice: int) -> int | None:
    """The seed of choice `choice` of a prompt: `seed` itself for the first, then a
    reproducible, well-spread variant per choice (None stays None: fresh randomness)."""
    if seed is None or choice == 0:
        return seed
    return (seed + choice * _SEED_STRIDE) % 2**64


async def tokenize(
    tokenizer: Tokenizer, text: str, *, add_special: bool, tracer: Tracer | None = None
) -> list[int]:
    """Token ids of `text` (special tokens parsed); long texts run on a worker thread."""
    run = partial(tokenizer.tokenize, text, add_special=add_special, parse_special=True)
    with tokenize_span(tracer, len(text)):
        if len(text) > _THREAD_TOKENIZE_CHARS:
            return await anyio.to_thread.run_sync(run)
        return run()


async def tokenize_chat(
    tokenizer: Tokenizer,
    template: ChatTemplate,
    messages: list[dict[str, object]],
    *,
    add_generation_prompt: bool = True,
    add_special: bool | None = None,
    tools: list[dict[str, object]] | None = None,
    tracer: Tracer | None = None,
) -> list[int]:
    """Token ids of `messages` rendered by the chat template (with `tools`, for templates
    that render tools themselves). By default BOS is added unless the rendered text
    already starts with it (`add_special` overrides)."""
    text = template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    if add_special is None:
        add_special = _wants_bos(tokenizer, text)
    return await tokenize(tokenizer, text, add_special=add_special, tracer=tracer)


def _wants_bos(tokenizer: Tokenizer, text: str, context: Sequence[int] = ()) -> bool:
    """BOS goes first unless a context comes first or the text already starts with it."""
    bos = tokenizer.bos_text
    return not context and not (bos and text.startswith(bos))


def _render(template: ChatTemplate, tools: ChatTools, continue_final: bool) -> str:
    """The prompt text; with `continue_final`, the conversation up to the last assistant
    message's content, left open (what Hugging Face calls `continue_final_message`)."""
    if not continue_final:
        return template.render(tools.messages, tools=tools.template_tools)
    text = template.render(tools.messages, add_generation_prompt=False, tools=tools.template_tools)
    last = tools.messages[-1].get("content") if tools.messages else None
    if isinstance(last, str) and last and last in text:
        return text[: text.rindex(last) + len(last)]
    return text


async def compile_output(
    compiler: ConstraintCompiler, output: OutputSpec | None
) -> OutputConstraint | None:
    """The compiled constraint (None for free output). Raises InvalidRequest (400) for a
    schema or grammar that is invalid, too large, or cannot be enforced."""
    if output is None:
        return None
    if isinstance(output, GrammarOutput):
        return await grammar_constraint(compiler, output.text, output.syntax, output.param)
    return await schema_constraint(compiler, output.schema, output.param)


class Planner:
    """Plans requests for one model (`serving`) on behalf of one caller."""

    def __init__(
        self, serving: ServingState, tracer: Tracer | None, metrics: Metrics | None = None
    ) -> None:
        self.serving = serving
        self.tracer = tracer
        self.metrics = metrics

    async def plan(self, spec: GenerationSpec) -> GenerationPlan:
        """The engine requests of `spec` (module docstring for what is checked)."""
        serving = self.serving
        output = await compile_output(serving.constraints, spec.output)
        tools = self._tools(spec.prompts)
        if tools is not None and tools.plan is not None:
            output = await tools_constraint(tools, output, serving.constraints)
        prompts = [await self._tokens(prompt, tools) for prompt in spec.prompts]
        choices = self._choices(spec, prompts, output.grammar if output else None)
        response_id = choices[0].request.request_id
        return GenerationPlan(response_id, choices, output, tools)

    def _tools(self, prompts: Sequence[Prompt]) -> ChatTools | None:
        """The tool setup of a chat prompt (None for text and token prompts)."""
        chat = [p for p in prompts if isinstance(p, ChatPrompt)]
        if not chat:
            return None
        serving = self.serving
        return plan_tools(chat[0].messages, chat[0].tools, serving.chat_template, serving.tokenizer)

    async def _tokens(self, prompt: Prompt, tools: ChatTools | None) -> PlannedPrompt:
        serving = self.serving
        tokenizer = serving.tokenizer
        if isinstance(prompt, ChatPrompt):
            assert tools is not None  # NOTE: planned for every chat prompt
            context = prompt.context_token_ids
            check_token_ids(context, serving.model_info.n_vocab, "context")
            text = _render(serving.chat_template, tools, prompt.continue_final)
            add_special = _wants_bos(tokenizer, text, context)
            return await self._pieces(text, context, add_special, prompt.images)
        if isinstance(prompt, TextPrompt):
            context = prompt.context_token_ids
            check_token_ids(context, serving.model_info.n_vocab, "context")
            wanted = prompt.add_special
            bos = _wants_bos(tokenizer, prompt.text, context) if wanted is None else wanted
            return await self._pieces(prompt.text, context, bos, prompt.images)
        check_token_ids(prompt.token_ids, serving.model_info.n_vocab, "prompt")
        return PlannedPrompt(prompt.token_ids)

    async def _pieces(
        self, text: str, context: list[int], add_special: bool, images: ImageSet | None
    ) -> PlannedPrompt:
        """`context` + the tokens of `text`; with images, the text is tokenized piece by
        piece between their markers and each image goes where its marker stood. Raises
        InvalidRequest for an image refused (api/images) or a template that did not
        render every image exactly once."""
        serving, tracer = self.serving, self.tracer
        tokenizer = serving.tokenizer
        if not images:
            tokens = await tokenize(tokenizer, text, add_special=add_special, tracer=tracer)
            return PlannedPrompt(context + tokens)
        settings = serving.settings.multimodal
        resolved = await resolve_images(images.refs, settings, serving.model_info, self.metrics)
        pieces = text.split(images.marker)
        if len(pieces) != len(resolved) + 1:
            raise InvalidRequest(
                f"the model's chat template rendered {len(pieces) - 1} of the request's "
                f"{len(resolved)} images; it must keep every message that carries one",
                param=images.refs[0].param,
            )
        token_ids = list(context)
        inputs: list[ImageInput] = []
        for index, piece in enumerate(pieces):
            if index:
                image = resolved[index - 1]
                inputs.append(
                    ImageInput(sha256=image.sha256, data=image.data, position=len(token_ids))
                )
            if piece or index == 0:
                bos = add_special and index == 0
                token_ids += await tokenize(tokenizer, piece, add_special=bos, tracer=tracer)
        return PlannedPrompt(token_ids, inputs)

    def _choices(
        self, spec: GenerationSpec, prompts: list[PlannedPrompt], constraint: str | None
    ) -> list[Choice]:
        """Every choice of every prompt. Raises InvalidRequest (empty prompt, logit_bias
        outside the vocabulary) and ContextLengthExceeded."""
        info = self.serving.model_info
        response_id = f"{spec.id_prefix}-{uuid.uuid4().hex}"
        choices = []
        for prompt_index, (token_ids, images) in enumerate(prompts):
            if not token_ids:
                raise InvalidRequest("the prompt is empty", param=spec.prompt_param)
            sampling = spec.sampling(self._max_tokens(spec, len(token_ids)))
            if prompt_index == 0:
                check_token_ids(list(sampling.logit_bias), info.n_vocab, "logit_bias")
            for j in range(spec.n):
                index = prompt_index * spec.n + j
                choice_sampling = msgspec.structs.replace(
                    sampling, seed=derive_seed(sampling.seed, j), constraint=constraint
                )
                request = AddRequest(
                    request_id=response_id if index == 0 else f"{response_id}-{index}",
                    prompt_token_ids=token_ids,
                    sampling=choice_sampling,
                    priority=spec.priority,
                    images=images,
                    hold_s=0.0 if spec.stream else COLLECT_HOLD_S,
                )
                choices.append(Choice(index, prompt_index, request))
        return choices

    def _max_tokens(self, spec: GenerationSpec, num_prompt_tokens: int) -> int:
        n_ctx = self.serving.model_info.n_ctx
        requested = spec.max_tokens
        if requested is not None and spec.clamp_max_tokens:
            requested = min(requested, max(n_ctx - num_prompt_tokens, 1))
        return resolve_max_tokens(num_prompt_tokens, requested, n_ctx, spec.prompt_param)
