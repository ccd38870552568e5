/* The mesh's thin C SDK: an MCP-over-stdio tools server on jansson.
 *
 * A tools bundle in C registers its tools and hands control to mesh_serve_stdio(); the node's
 * runtime speaks MCP to it over stdin/stdout. Tool arguments and structured results are jansson
 * values (json_t), so bundle code uses jansson directly: the SDK does not hide it.
 *
 * Calls are answered one at a time, in the order they arrive. The runtime may put many calls on
 * the pipe at once; each is answered by its id. A long call delays the ones behind it, so a
 * tool that can take long should say so in its manifest's timeout_ms, poll
 * mesh_call_cancelled() and report mesh_call_progress().
 */
#ifndef MESH_H
#define MESH_H

#include <jansson.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MESH_SDK_VERSION "0.1.0"

typedef struct mesh_server mesh_server;
typedef struct mesh_result mesh_result;

/* A tool's code: read `arguments` (always a JSON object, {} when the caller sent none), fill
 * `result`. Both are borrowed from the SDK: json_incref() what must outlive the call, and never
 * free them. (`arguments` is not const because jansson's iteration, json_object_foreach, needs
 * a non-const object.) */
typedef void (*mesh_tool_handler)(json_t *arguments, mesh_result *result, void *userdata);

/* A server that tells the runtime its name and version. NULL only when out of memory. */
mesh_server *mesh_server_new(const char *name, const char *version);
void mesh_server_free(mesh_server *server);

/* Register a tool. `input_schema_json` is the JSON Schema of the arguments as text, an object
 * with "type": "object"; NULL means "any object". Returns 0, or -1 (and logs why) for an invalid
 * name, a name already taken, or a schema that does not parse. */
int mesh_tool_add(mesh_server *server, const char *name, const char *description,
                  const char *input_schema_json, mesh_tool_handler handler, void *userdata);

/* Add a text block to the result (printf-style). */
void mesh_result_text(mesh_result *result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Mark the result as a tool error and add a text block saying what went wrong. */
void mesh_result_error(mesh_result *result, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Set the structured result, a JSON object; the result takes the reference (steals it). When no
 * text was added, the SDK adds the object's JSON as text, as MCP asks for older clients. */
void mesh_result_structured(mesh_result *result, json_t *object);

/* ---- the call: who is calling, cancellation, progress ---------------------------------------
 * A handler's `result` also stands for its call: pass it to these, from the handler's own
 * thread, while the handler runs (the loop is single-threaded and holds no locks). */

#define MESH_CALLER_FIELD_MAX 256 /* longest account, user, name or person field accepted, in bytes */

/* The human behind a delegate's call (an MCP face, a console), as the delegate named them. */
struct mesh_person {
    const char *iss;  /* who vouched for them: an OAuth issuer, or "unix:<host>" for an OS user */
    const char *sub;  /* their subject there */
    const char *name; /* shown to people */
};

/* Who is calling, as the node took it from the NATS server-stamped request info. The strings
 * live as long as the call. */
struct mesh_caller {
    const char *account; /* never NULL */
    const char *user;    /* NULL when the account's import does not share it */
    const char *name;    /* NULL when not known */
    const char *via;     /* "bus", "local", "mcp" or "console" */
    const struct mesh_person *person; /* a delegate's person (via "mcp" or "console"), else NULL */
    /* The author/owner key: the person's when a delegate named one ("person:<iss>/<sub>"), else
     * "<account>/<user>" ("<account>" without a user), "local:" before it for the node's own
     * caller; names escaped ('%', '/', ':' as %25, %2F, %3A) so no two callers share one. */
    const char *id;
};

/* The caller from the call's _meta["mesh/caller"], or NULL when there is none (a bundle run by
 * hand) or it is malformed (logged as a warning): account a non-empty string, user and name
 * non-empty strings or null, none longer than MESH_CALLER_FIELD_MAX bytes or holding control
 * characters, via one of the four; a person only with via mcp or console, its iss, sub and name
 * such strings. Never take identity from the arguments. */
const struct mesh_caller *mesh_call_caller(const mesh_result *call);

/* 1 once the caller cancelled this call (notifications/cancelled), else 0. The loop cannot read
 * while the handler runs, so this looks: it reads what is waiting on stdin without blocking (at
 * most 16 MiB ahead; what it reads is served after the handler, in order) for a cancel of this
 * call. About a microsecond: call it between units of work. A cancelled call's result is never
 * sent, whatever the handler fills in, even when the handler never asked. */
int mesh_call_cancelled(mesh_result *call);

/* Send notifications/progress with the request's progressToken: `progress` so far, `total`
 * when > 0 (otherwise unknown), `message` when not NULL. Written at once, so calls arrive in
 * order; a no-op (0) when the caller asked for no progress or the call is cancelled. Returns 0,
 * or -1 with errno EINVAL (a number that is not finite, a message that is not UTF-8) or EIO
 * (stdout failed). */
int mesh_call_progress(mesh_result *call, double progress, double total, const char *message);

/* ---- asking the caller of this call (elicitation) -------------------------------------------
 * The node passes a child's elicitation/create to the caller of the call it belongs to; with
 * several calls in flight it knows which by _meta["mesh/call"], which these copy from the call
 * onto the request (sdk/COMMON.md, "Asking"). They block until the answer comes: meanwhile the
 * SDK reads stdin (as mesh_call_cancelled() does) and keeps every other line for the loop to
 * serve after the handler, in order. A caller that cannot answer makes the request fail at once
 * with a JSON-RPC error, never a hang. */

enum mesh_elicit_action { MESH_ELICIT_ACCEPT, MESH_ELICIT_DECLINE, MESH_ELICIT_CANCEL };

/* What the caller answered. The strings live as long as the call. */
struct mesh_elicit_answer {
    enum mesh_elicit_action action; /* MESH_ELICIT_CANCEL when the asking failed */
    const char *content;            /* accept in form mode: the answer, a JSON object as text; else NULL */
    const char *error;              /* when the asking failed: why (the client's error message); else NULL */
};

/* Ask the caller to fill a form: `message` for people, `schema_json` the requested schema as
 * text (an object with "type": "object" and primitive properties). Returns 0 with the answer,
 * or -1 with out->error set: the client answered with a JSON-RPC error, the call is cancelled
 * (this call then is too), stdin closed or failed, more than 16 MiB arrived before the answer,
 * stdout failed, or the arguments are bad (not UTF-8, a schema that is not such an object). */
int mesh_call_elicit(mesh_result *call, const char *message, const char *schema_json, struct mesh_elicit_answer *out);

/* Send the caller's user to `url` (URL mode: what happens there never passes the mesh);
 * `elicitation_id` names it for a later notifications/elicitation/complete. As
 * mesh_call_elicit(), but out->content is always NULL. */
int mesh_call_elicit_url(mesh_result *call, const char *message, const char *url, const char *elicitation_id,
                         struct mesh_elicit_answer *out);

/* Write "<seat>.<verb>", the tool name that implements a seat's verb, into buf.
 * seat: [a-z][a-z0-9-]{0,62}; verb: [A-Za-z0-9_-]{1,63} (no dot: the name has exactly one).
 * Returns 0, or -1 with errno EINVAL (bad seat or verb) or ERANGE (buf too small). */
int mesh_seat_verb(char *buf, size_t size, const char *seat, const char *verb);

/* What the runtime tells the bundle through MESH_* variables. Fields are "" when unset (a
 * bundle run by hand); they point into the environment and live as long as the process. */
struct mesh_facts {
    const char *node;       /* MESH_NODE */
    const char *module;     /* MESH_MODULE */
    const char *bundle;     /* MESH_BUNDLE */
    const char *bundle_dir; /* MESH_BUNDLE_DIR: the unpacked bundle, read-only by intent */
    const char *data_dir;   /* MESH_DATA_DIR: persistent per-module data, survives upgrades */
};

/* Fill `out`, creating data_dir (and its parents) when it is set. Returns 0, or -1 (and logs
 * why, errno set) when the data folder cannot be created. */
int mesh_facts(struct mesh_facts *out);

enum mesh_log_level { MESH_DEBUG, MESH_INFO, MESH_WARN, MESH_ERROR };

/* One line on stderr, which the runtime captures: "<level>: <message>". Newlines in the message
 * become spaces so one call is one line. Below LOG_LEVEL (debug|info|warn|error, default info)
 * nothing is written. */
void mesh_log(enum mesh_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Serve MCP on stdin/stdout until stdin closes. Returns 0 on end of input, 1 when stdout or
 * stdin fails. While it runs, fd 1 is pointed at stderr so stray printf()s in tool code land in
 * the log instead of corrupting the protocol. */
int mesh_serve_stdio(mesh_server *server);

#ifdef __cplusplus
}
#endif

#endif /* MESH_H */
