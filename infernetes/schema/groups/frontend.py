"""The HTTP front end: listening address, TLS, CORS, auth, chat templates, tool calling."""

from infernetes.schema.choices import TOOL_CALL_PARSERS
from infernetes.schema.declare import Arg

G = "frontend"

ARGS = (
    Arg(
        "host",
        "str",
        None,
        G,
        "Address to listen on; all interfaces when unset.",
        operator_owned=True,
    ),
    Arg(
        "port",
        "int",
        8000,
        G,
        "TCP port of the HTTP server.",
        minimum=0,
        maximum=65535,
        operator_owned=True,
    ),
    Arg(
        "uvicorn-log-level",
        "str",
        "info",
        G,
        "Log level of the uvicorn HTTP server.",
        choices=("debug", "info", "warning", "error", "critical", "trace"),
    ),
    Arg(
        "disable-uvicorn-access-log",
        "bool",
        False,
        G,
        "Do not log every HTTP request uvicorn serves.",
    ),
    Arg("allow-credentials", "bool", False, G, "CORS: allow credentials."),
    Arg("allowed-origins", "json", ["*"], G, "CORS: allowed origins, a JSON list."),
    Arg("allowed-methods", "json", ["*"], G, "CORS: allowed methods, a JSON list."),
    Arg("allowed-headers", "json", ["*"], G, "CORS: allowed headers, a JSON list."),
    Arg(
        "api-key",
        "str",
        None,
        G,
        "Require this bearer key on every API request.",
        nargs=None,
        secret=True,
    ),
    Arg(
        "lora-modules",
        "name_path",
        None,
        G,
        "LoRA adapters to serve, each as name=path or a JSON object with name, path and base_model_name.",
        nargs="+",
    ),
    Arg(
        "prompt-adapters",
        "name_path",
        None,
        G,
        "Prompt adapters to serve, each as name=path.",
        nargs="+",
    ),
    Arg(
        "chat-template", "str", None, G, "Chat template: a file path, or the Jinja template inline."
    ),
    Arg(
        "trust-request-chat-template",
        "bool",
        False,
        G,
        "Let requests bring their own chat_template (rendered in a sandboxed process, bounded in "
        "time and memory); refused with HTTP 400 otherwise.",
    ),
    Arg(
        "chat-template-content-format",
        "str",
        "auto",
        G,
        "How message content is handed to the chat template: as a plain string or as OpenAI-style parts.",
        choices=("auto", "string", "openai"),
    ),
    Arg("response-role", "str", "assistant", G, "Role name of generated chat messages."),
    Arg("ssl-keyfile", "str", None, G, "TLS private key file."),
    Arg("ssl-certfile", "str", None, G, "TLS certificate file."),
    Arg("ssl-ca-certs", "str", None, G, "CA bundle used to verify client certificates."),
    Arg(
        "enable-ssl-refresh",
        "bool",
        False,
        G,
        "Reload the TLS context when the certificate files change.",
    ),
    Arg(
        "ssl-cert-reqs",
        "int",
        0,
        G,
        "Whether a client certificate is required (the ssl module's CERT_* value).",
        choices=(0, 1, 2),
    ),
    Arg(
        "root-path", "str", None, G, "URL prefix when the server sits behind a path-routing proxy."
    ),
    Arg(
        "middleware",
        "str",
        [],
        G,
        "Import path of an extra ASGI middleware; repeat for several.",
        nargs="*",
    ),
    Arg(
        "return-tokens-as-token-ids",
        "bool",
        False,
        G,
        "Report logprob tokens as 'token_id:<id>' so tokens that are not valid text stay identifiable.",
    ),
    Arg(
        "disable-frontend-multiprocessing",
        "bool",
        False,
        G,
        "Run the HTTP front end in the same process as the engine.",
    ),
    Arg(
        "enable-request-id-headers",
        "bool",
        False,
        G,
        "Add an X-Request-Id header to every response.",
    ),
    Arg(
        "enable-auto-tool-choice",
        "bool",
        False,
        G,
        "Let the model decide when to call tools (tool_choice=auto); needs --tool-call-parser.",
    ),
    Arg(
        "tool-call-parser",
        "str",
        None,
        G,
        "Parser that turns the model's tool-call text into OpenAI tool calls; a name from "
        "--tool-parser-plugin is also accepted.",
        choices=TOOL_CALL_PARSERS,
    ),
    Arg("tool-parser-plugin", "str", "", G, "Python file that registers extra tool-call parsers."),
    Arg(
        "log-config-file", "str", None, G, "JSON logging configuration for the server and uvicorn."
    ),
    Arg(
        "max-log-len",
        "int",
        None,
        G,
        "Log at most this many prompt characters or token ids per request (--enable-log-requests).",
        minimum=0,
    ),
    Arg(
        "disable-fastapi-docs",
        "bool",
        False,
        G,
        "Do not serve the OpenAPI schema, Swagger UI and ReDoc.",
    ),
    Arg("enable-prompt-tokens-details", "bool", False, G, "Report prompt_tokens_details in usage."),
    Arg("enable-server-load-tracking", "bool", False, G, "Track the number of in-flight requests."),
    Arg(
        "enable-tokenizer-info-endpoint",
        "bool",
        False,
        G,
        "Serve GET /tokenizer_info (the tokenizer's class, special tokens, settings and chat "
        "template), which remote-tokenizer clients such as lm-eval read.",
    ),
    Arg(
        "enable-log-requests",
        "bool",
        False,
        G,
        "Log each request: its id and sampling parameters at INFO, its prompt (cut to "
        "--max-log-len) at DEBUG.",
    ),
    Arg(
        "max-concurrency",
        "int",
        None,
        G,
        "Most inference requests (completions, chat, embeddings) in flight at once; one more gets "
        "HTTP 429. Unlimited when unset.",
        minimum=1,
    ),
    Arg(
        "shutdown-timeout",
        "int",
        30,
        G,
        "Seconds in-flight requests may take to finish after SIGTERM/SIGINT; the rest are then "
        'aborted (a stream ends with finish_reason "abort"). Meanwhile new requests and /health '
        "get HTTP 503. 0 aborts at once, as in vLLM; the default drains, and ends before the "
        "operator's default terminationGracePeriodSeconds (60).",
        minimum=0,
    ),
    Arg(
        "reasoning-effort",
        "str",
        None,
        G,
        "Reasoning effort for requests that do not ask for one.",
        choices=("low", "medium", "high"),
    ),
    Arg(
        "api-server-count",
        "int",
        1,
        G,
        "Number of API server processes.",
        aliases=("-asc",),
        minimum=1,
    ),
    Arg(
        "headless",
        "bool",
        False,
        G,
        "Run without an API server: a node after the first of --nnodes runs only its ranks, which "
        "node 0 calls.",
        operator_owned=True,
    ),
    Arg(
        "data-parallel-start-rank",
        "int",
        0,
        G,
        "First data-parallel rank run on this node.",
        aliases=("-dpr",),
        minimum=0,
        operator_owned=True,
    ),
)
