"""What differs between the engine versions this double can be (one git branch each in the lab's repo).

Every value here is either read from the public source named in `checked_against`, or marked as an
assumption (the TP3 recipe's engine is not public). The lab's repository writes the version of a
branch into `_build.py`; nothing at run time can switch it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# DeepSeek's encoder budgets for the effort names (sfxnz/TensorFold docs/recipes/deepseek-v4.1-flash.md):
# low, high and max are 50, 75 and 100; medium is heard as high and xhigh as max.
DSV41_EFFORTS = {"low": 50, "medium": 75, "high": 75, "xhigh": 100, "max": 100}
# The TP3 recipe card's table (docs/recipes.md "The TP3 recipe"):
# minimal 25, low 50, medium 62, high 75, xhigh 88, max 100.
TP3_CARD_EFFORTS = {"minimal": 25, "low": 50, "medium": 62, "high": 75, "xhigh": 88, "max": 100}


@dataclass(frozen=True)
class Version:
    key: str  # the lab's name for it: 0.6.4, 0.6.6, tp3-recipe
    version: str  # tensorfold.__version__
    checked_against: str
    tp_choices: tuple[int, ...]
    rank_choices: tuple[int, ...]
    api_keys: bool  # --api-key, --api-key-file, --metrics-open, TENSORFOLD_API_KEY
    name_priority: bool  # --name-priority (upstream python-0.6 v0.6.6)
    world: int  # the only --tp the deepseek_v41 family serves on
    max_parallel: int  # --parallel N refused above this
    efforts: dict[str, int] = field(default_factory=dict)
    sampling: dict[str, float] = field(default_factory=dict)  # the family's defaults (request and CLI win)
    default_effort: str | None = None  # effort of a thinking request that names none
    forced_tools: bool = False  # tool_choice "required" / a named function
    structured_output: bool = False  # response_format json_schema / json_object
    thinking_field: bool = False  # a top-level "thinking": false in the request body
    assumed: tuple[str, ...] = ()  # what is not read from a public source


V064 = Version(
    key="0.6.4",
    version="0.6.4",
    checked_against="sfxnz/TensorFold @ 2258b00d1bbd74cae23d227f6cf41de946e49451",
    tp_choices=(1, 2),
    rank_choices=(0, 1),
    api_keys=False,
    name_priority=False,
    world=2,
    max_parallel=4,
    efforts=DSV41_EFFORTS,
    sampling={"temperature": 1.0, "top_p": 0.95, "top_k": 0},
)

V066 = Version(
    key="0.6.6",
    version="0.6.6",
    checked_against="sfxnz/TensorFold @ dc971a2c47b9d29622e0b7f69b0708418694d700",
    tp_choices=(1, 2, 4),
    rank_choices=(0, 1, 2, 3),
    api_keys=True,
    name_priority=True,
    world=2,
    max_parallel=4,
    efforts=DSV41_EFFORTS,
    sampling={"temperature": 1.0, "top_p": 0.95, "top_k": 0},
)

TP3 = Version(
    key="tp3-recipe",
    version="0.6.6+tp3recipe",
    checked_against="not public: ChimeraWerks 'TensorFold dsv41 30a9647' (TP3 recipe card, docs/recipes.md)",
    tp_choices=(1, 2, 3),
    rank_choices=(0, 1, 2),
    api_keys=True,
    name_priority=True,
    world=3,
    max_parallel=16,
    efforts=TP3_CARD_EFFORTS,
    sampling={"temperature": 1.0, "top_p": 1.0, "top_k": 20},
    default_effort="high",
    forced_tools=True,
    structured_output=True,
    thinking_field=True,
    assumed=(
        "the serve flags are 0.6.6's with --tp 1,2,3 and --rank 0-2",
        "the family serves on exactly three ranks and up to 16 requests at once (the card: 16 streams)",
        "sampling defaults, efforts, a thinking field, forced tool calls, enforced JSON schemas: the card's",
        "every other request refusal is 0.6.6's",
    ),
)

VERSIONS = {v.key: v for v in (V064, V066, TP3)}


def get(key: str) -> Version:
    try:
        return VERSIONS[key]
    except KeyError:
        raise ValueError(f"unknown engine version {key!r}; known: {', '.join(VERSIONS)}") from None
