"""What each Lambda function is given, as data: its environment variables, its table access and its Step
Functions access. The stack builds every function from these tables, and the tests hold the template to them.

A function sees only the variables its template gives it, and every AWS call it makes is authorized against
its own role, so each entry says what that function's code reaches (``serving/routes.py`` maps the API's
routes to functions; the workflow's functions are in ``serving/workflow/``), and nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from dormant.serving.deployed import MODEL, OPENAI_BASE_URL, OPENAI_SECRET
from dormant.serving.routes import ROUTES
from dormant.stores.dynamodb import DUE_INDEX, LISTING_INDEX, PENDING_INDEX, RUNNING_INDEX, STATUS_INDEX

# -- environment ----------------------------------------------------------------------------------

STORE = "DORMANT_STORE"
APP = "DORMANT_APP"
IDEMPOTENCY_TABLE = "DORMANT_IDEMPOTENCY_TABLE"
STATE_MACHINE = "DORMANT_STATE_MACHINE"
WAIT_MACHINE = "DORMANT_WAIT_MACHINE"  # the waits machine (starts at Park): a parked hand-on, a lost wait's restart
TENANT_CLAIM = "DORMANT_TENANT_CLAIM"
CORS_ORIGINS = "DORMANT_CORS_ORIGINS"  # serving.api.CORS_ORIGINS: -c cors_origins=, empty (no origin) by default
TURN_QUOTA = "DORMANT_TURN_QUOTA"  # -c turn_quota=N/SECONDS; empty: none (dormant.serving.quota)
ADMIN_GROUP = "DORMANT_ADMIN_GROUP"  # -c admin_group=, default admins (dormant.serving.callers)
MACHINE_CLIENTS = "DORMANT_MACHINE_CLIENTS"  # client id -> tenant, of -c machine_clients (infra.clients)
COMMON_ENVIRONMENT = frozenset(
    {
        STORE,
        APP,
        "POWERTOOLS_SERVICE_NAME",
        "POWERTOOLS_METRICS_NAMESPACE",
        "POWERTOOLS_TRACE_DISABLED",
        "PYDANTIC_DISABLE_PLUGINS",
    }
)
"""What every function gets: the store, the app, Powertools' settings, and no pydantic plugin scan."""

CALLER_ENVIRONMENT = frozenset({TENANT_CLAIM, ADMIN_GROUP, MACHINE_CLIENTS})
"""What the API's functions read the caller by (``dormant.serving.callers``): the tenant claim, the admin group,
the machine clients' tenants."""

API_FUNCTIONS = frozenset(function for _, _, function in ROUTES)
"""The functions behind the HTTP API (sessions, run, tools, commit): idempotency by ``Idempotency-Key``."""

ENVIRONMENT: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        # the API's functions read the caller's tenant from the claim TENANT_CLAIM names (-c tenant_claim=), or a
        # machine client's from MACHINE_CLIENTS, and the role from ADMIN_GROUP,
        # answer browsers of the allowed origins (sessions answers their preflights too), and read the turn
        # quota (only POST /runs, in run, takes from it)
        "sessions": COMMON_ENVIRONMENT | CALLER_ENVIRONMENT | {IDEMPOTENCY_TABLE, CORS_ORIGINS, TURN_QUOTA},
        # starts the execution that runs the turn it is about to claim (before the claim: every claim has a runner),
        # or, for a caller that waits, runs the turn and starts an execution only if it parks or outlasts the hold
        "run": COMMON_ENVIRONMENT
        | CALLER_ENVIRONMENT
        | {IDEMPOTENCY_TABLE, STATE_MACHINE, WAIT_MACHINE, CORS_ORIGINS, TURN_QUOTA},
        # wakes a waiting execution with the task token stored on the session; for a caller that waits, runs the
        # answered turn and starts an execution only if it parks again or outlasts the hold
        "tools": COMMON_ENVIRONMENT
        | CALLER_ENVIRONMENT
        | {IDEMPOTENCY_TABLE, STATE_MACHINE, WAIT_MACHINE, CORS_ORIGINS, TURN_QUOTA},
        "commit": COMMON_ENVIRONMENT | CALLER_ENVIRONMENT | {IDEMPOTENCY_TABLE, CORS_ORIGINS, TURN_QUOTA},
        # answers its own task token (park) or runs in the execution (resume): no ARN needed
        "park": COMMON_ENVIRONMENT,
        "resume": COMMON_ENVIRONMENT,
        # repairs, purges, and hands a turn whose runner died (or a lost wait: WAIT_MACHINE) to a fresh execution
        "sweeper": COMMON_ENVIRONMENT | {STATE_MACHINE, WAIT_MACHINE},
    }
)
"""Function -> the names of its environment variables (the values are the stack's)."""

MODEL_ENVIRONMENT = frozenset({MODEL, OPENAI_BASE_URL, OPENAI_SECRET})
"""With ``-c model=...`` every function also gets these (those that apply): every function builds the same
served app, whose factory is given the deployment's model. They name the model, a server and *where* its key is
kept; no function's environment holds a key."""

MODEL_FUNCTIONS = frozenset({"resume", "run", "tools"})
"""The functions that call the model, the only ones granted ``bedrock:InvokeModel`` on the chosen model or read
on its key: ``resume`` runs turns in the workflow, ``run`` the turns whose caller waits (``Prefer: wait``) until
they park or the hold ends, ``tools`` the rest of an answered turn whose caller waits (issue 36).
The key is read on the first model call, not when the app is built."""

MODEL_ACTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        # Converse is authorized as bedrock:InvokeModel (there is no bedrock:Converse action); no streaming.
        "bedrock": ("bedrock:InvokeModel",),
        "secretsmanager": ("secretsmanager:GetSecretValue",),
        "ssm": ("ssm:GetParameter",),
    }
)
"""What a model function may call, by where its model or key is: Bedrock's Converse, or the read of its key
(Powertools' ``get_secret`` is one ``GetSecretValue``, ``get_parameter`` one ``GetParameter``)."""

# -- the table ------------------------------------------------------------------------------------

SESSION_ACTIONS = (
    "dynamodb:GetItem",  # the meta item, a snapshot, the touch a repair checks; idempotency records
    "dynamodb:BatchGetItem",  # the id items of re-sent event ids (one call for a turn's)
    "dynamodb:DescribeTable",  # the table's shape, checked once by the first store on a new table
    "dynamodb:Query",  # a session's items; a scoped partition; an index (below)
    "dynamodb:PutItem",  # Put items of a TransactWriteItems (bindings, scoped keys, touches, snapshot); idempotency
    "dynamodb:UpdateItem",  # the gate, the recount, the finish, a rollback; idempotency
    "dynamodb:DeleteItem",  # a deleted session's meta item, a rolled-back create, a dropped touch; idempotency
    "dynamodb:BatchWriteItem",  # event items in batches of 25; deletes of a rolled-back commit's items
    "dynamodb:ConditionCheckItem",  # the ConditionCheck of the snapshot write's TransactWriteItems
)
"""What loading and committing a session calls. Every function loads and commits sessions (a commit may meet a
stale marker and repair it: rollback deletes included), and a committed load may save a snapshot. IAM has no
TransactWriteItems action: a transaction is authorized item by item (Put, Update, Delete, ConditionCheck)."""


@dataclass(frozen=True)
class TableAccess:
    """``actions`` on the table, and ``Query`` on the named ``indexes`` of it (each by its own ARN)."""

    actions: tuple[str, ...]
    indexes: tuple[str, ...]


TABLE_ACCESS: Mapping[str, TableAccess] = MappingProxyType(
    {
        # the listing: a Query per shard of the listing index (of the status index, with ?status=), which
        # projects the rows (no BatchGetItem)
        "sessions": TableAccess(SESSION_ACTIONS, (LISTING_INDEX, STATUS_INDEX)),
        "run": TableAccess(SESSION_ACTIONS, ()),
        "tools": TableAccess(SESSION_ACTIONS, ()),
        "commit": TableAccess(SESSION_ACTIONS, ()),
        "park": TableAccess(SESSION_ACTIONS, ()),
        "resume": TableAccess(SESSION_ACTIONS, ()),
        # repair_pending finds stale markers through the pending-marker index; running_sessions finds the turns
        # whose runner may have died through the running index
        # and the running-sessions index, whose meta items it reads back by BatchGetItem; the waits that are due
        # through the due index (which projects what it needs)
        "sweeper": TableAccess(SESSION_ACTIONS, (PENDING_INDEX, RUNNING_INDEX, DUE_INDEX)),
    }
)
"""Function -> its table access. Re-sent event ids are read by key (their id items: no index); only the session
listing reads ``LISTING_INDEX`` and ``STATUS_INDEX``, and only the sweeper ``PENDING_INDEX``, ``RUNNING_INDEX`` and
``DUE_INDEX``."""

# -- Step Functions -------------------------------------------------------------------------------

MACHINE = "machine"
EXECUTIONS = "executions"
WAITS = "wait_machine"
WAIT_EXECUTIONS = "wait_executions"
BOTH = (MACHINE, WAITS)
STATES_ACCESS: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        # the execution of a turn it claims (the sessions machine), or of a turn it ran to its park (the waits one)
        "run": {"states:StartExecution": BOTH},
        # hands a dead runner's turn (sessions) or a lost wait (waits) to a fresh execution; asks whether a wait's
        # execution lives (DescribeExecution, authorized on the execution, of either machine); sends the wake-up
        # POST /tools lost (SendTaskFailure, Answered; SendTaskSuccess only to a wait the sessions machine parked
        # before Answered, whose record names no answer_error: the waits machine's records all do)
        "sweeper": {
            "states:StartExecution": BOTH,
            "states:DescribeExecution": (EXECUTIONS, WAIT_EXECUTIONS),
            "states:SendTaskSuccess": (MACHINE,),
            "states:SendTaskFailure": BOTH,
        },
        # A task token is authorized against the state machine whose execution issued it (either parks). Success
        # ends the execution (the answered turn runs in the request); failure with Answered sends it to Continue
        # (the turn goes on in the next execution). A failure of the workflow's own is RecordFailure's.
        # ... and starts the execution of an answered turn it ran that parked again (waits) or outlasted the hold
        "tools": {"states:SendTaskSuccess": BOTH, "states:SendTaskFailure": BOTH, "states:StartExecution": BOTH},
        "park": {"states:SendTaskSuccess": BOTH, "states:SendTaskFailure": BOTH},
    }
)
"""Function -> action -> what it acts on: the sessions machine (``MACHINE``) or its executions (``EXECUTIONS``),
the waits machine (``WAITS``) or its executions (``WAIT_EXECUTIONS``). Functions not named here make no Step
Functions call: ``resume`` runs in the execution."""


def state_machine_name(stack_name: str) -> str:
    """The state machine's fixed name: its ARN can then be written without referencing the resource, so the
    functions it invokes can hold that ARN (and grants on it) without a circular dependency. At most 80
    characters, as Step Functions requires (a stack name has at most 128)."""
    suffix = "-sessions"
    return stack_name[: 80 - len(suffix)] + suffix


def wait_machine_name(stack_name: str) -> str:
    """The waits machine's fixed name (``state_machine_name``'s reasons), at most 80 characters."""
    suffix = "-waits"
    return stack_name[: 80 - len(suffix)] + suffix
