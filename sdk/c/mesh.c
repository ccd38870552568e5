/* The MCP-over-stdio loop of the mesh's C SDK (see mesh.h and README.md).
 *
 * One message per line in, one reply per line out. jansson does the JSON: it checks UTF-8,
 * keeps integer ids exact and bounds nesting depth, so this file only speaks the protocol.
 */
#define _POSIX_C_SOURCE 200809L

#include "internal.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The revisions this loop speaks; the last is offered when the client asks for another. */
static const char *const PROTOCOLS[] = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"};
#define LATEST_PROTOCOL "2025-11-25"

enum { PARSE_ERROR = -32700, INVALID_REQUEST = -32600, METHOD_NOT_FOUND = -32601, INVALID_PARAMS = -32602 };

struct tool {
    char *name;
    json_t *definition; /* {name, description, inputSchema}: what tools/list shows */
    mesh_tool_handler handler;
    void *userdata;
};

struct mesh_server {
    char *name, *version;
    struct tool *tools;
    size_t ntools, cap;
};

/* ---- small helpers ------------------------------------------------------------------------ */

void mesh__out_of_memory(void) {
    mesh_log(MESH_ERROR, "out of memory");
    abort();
}

json_t *mesh__need(json_t *value) {
    if (!value) mesh__out_of_memory();
    return value;
}

/* Callers pass only values that cannot be NULL for any reason but memory (UTF-8 checked before). */
static void put(json_t *object, const char *key, json_t *value) {
    if (json_object_set_new(object, key, mesh__need(value)) != 0) mesh__out_of_memory();
}

static char *vformat(const char *fmt, va_list ap) {
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) mesh__out_of_memory();
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

static int is_utf8(const char *s) {
    json_t *probe = json_string(s); /* jansson's own check; NULL means invalid */
    json_decref(probe);
    return probe != NULL;
}

static int ascii_alnum(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* 1..max characters, each alphanumeric or one of `punct`. */
static int name_ok(const char *s, size_t max, const char *punct) {
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= max || !(ascii_alnum(s[n]) || strchr(punct, s[n]))) return 0;
    return n > 0;
}

/* A seat name as manifests have it: [a-z][a-z0-9-]{0,62}. */
static int seat_ok(const char *s) {
    if (!(s[0] >= 'a' && s[0] <= 'z')) return 0;
    for (size_t n = 0; s[n]; n++)
        if (n >= 63 || !((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= '0' && s[n] <= '9') || s[n] == '-')) return 0;
    return 1;
}

/* ---- logging, facts, names ---------------------------------------------------------------- */

static enum mesh_log_level log_threshold(void) {
    const char *v = getenv("LOG_LEVEL");
    if (!v) return MESH_INFO;
    if (strcmp(v, "debug") == 0) return MESH_DEBUG;
    if (strcmp(v, "warn") == 0 || strcmp(v, "warning") == 0) return MESH_WARN;
    if (strcmp(v, "error") == 0) return MESH_ERROR;
    return MESH_INFO;
}

void mesh_log(enum mesh_log_level level, const char *fmt, ...) {
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (level > MESH_ERROR) level = MESH_ERROR;
    if (level < log_threshold()) return;
    va_list ap;
    va_start(ap, fmt);
    char *msg = vformat(fmt, ap);
    va_end(ap);
    if (!msg) return;
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "%s: %s\n", names[level], msg);
    free(msg);
}

static const char *env_or_empty(const char *name) {
    const char *v = getenv(name);
    return v ? v : "";
}

/* mkdir -p, private to the module (0700): the data folder holds its state. */
static int make_dirs(const char *path) {
    char *p = strdup(path);
    if (!p) mesh__out_of_memory();
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        char saved = *c;
        *c = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST) {
            free(p);
            return -1;
        }
        *c = saved;
        if (saved == '\0') break;
    }
    free(p);
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int mesh_facts(struct mesh_facts *out) {
    out->node = env_or_empty("MESH_NODE");
    out->module = env_or_empty("MESH_MODULE");
    out->bundle = env_or_empty("MESH_BUNDLE");
    out->bundle_dir = env_or_empty("MESH_BUNDLE_DIR");
    out->data_dir = env_or_empty("MESH_DATA_DIR");
    if (out->data_dir[0] && make_dirs(out->data_dir) != 0) {
        int saved = errno;
        mesh_log(MESH_ERROR, "cannot create the data folder MESH_DATA_DIR=%s: %s", out->data_dir, strerror(saved));
        errno = saved;
        return -1;
    }
    return 0;
}

int mesh_seat_verb(char *buf, size_t size, const char *seat, const char *verb) {
    if (!buf || !seat || !verb || !seat_ok(seat) || !name_ok(verb, 63, "_-")) {
        errno = EINVAL;
        return -1;
    }
    int n = snprintf(buf, size, "%s.%s", seat, verb);
    if (n < 0 || (size_t)n >= size) {
        if (size) buf[0] = '\0';
        errno = ERANGE;
        return -1;
    }
    return 0;
}

/* ---- server and tools --------------------------------------------------------------------- */

mesh_server *mesh_server_new(const char *name, const char *version) {
    if (!name || !version || !is_utf8(name) || !is_utf8(version)) {
        mesh_log(MESH_ERROR, "mesh_server_new: name and version must be UTF-8 text");
        return NULL;
    }
    mesh_server *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->name = strdup(name);
    s->version = strdup(version);
    if (!s->name || !s->version) {
        mesh_server_free(s);
        return NULL;
    }
    return s;
}

void mesh_server_free(mesh_server *s) {
    if (!s) return;
    for (size_t i = 0; i < s->ntools; i++) {
        free(s->tools[i].name);
        json_decref(s->tools[i].definition);
    }
    free(s->tools);
    free(s->name);
    free(s->version);
    free(s);
}

static struct tool *find_tool(mesh_server *s, const char *name, size_t len) {
    for (size_t i = 0; i < s->ntools; i++)
        if (strlen(s->tools[i].name) == len && memcmp(s->tools[i].name, name, len) == 0) return &s->tools[i];
    return NULL;
}

int mesh_tool_add(mesh_server *s, const char *name, const char *description, const char *input_schema_json,
                  mesh_tool_handler handler, void *userdata) {
    if (!s || !name || !handler) {
        mesh_log(MESH_ERROR, "mesh_tool_add: server, name and handler are required");
        return -1;
    }
    /* MCP's tool name rule; a <seat>.<verb> name passes it too (see mesh_seat_verb). */
    if (!name_ok(name, 128, "_-.")) {
        mesh_log(MESH_ERROR, "tool name \"%s\" is not valid: 1 to 128 of A-Z a-z 0-9 _ - .", name);
        return -1;
    }
    if (find_tool(s, name, strlen(name))) {
        mesh_log(MESH_ERROR, "tool \"%s\" is added twice", name);
        return -1;
    }
    if (description && !is_utf8(description)) {
        mesh_log(MESH_ERROR, "tool \"%s\": the description is not UTF-8 text", name);
        return -1;
    }
    json_error_t err;
    json_t *schema = input_schema_json ? json_loads(input_schema_json, 0, &err) : mesh__need(json_pack("{s:s}", "type", "object"));
    if (!schema) {
        mesh_log(MESH_ERROR, "tool \"%s\": the input schema is not JSON: %s (column %d)", name, err.text, err.column);
        return -1;
    }
    const char *type = json_string_value(json_object_get(schema, "type"));
    if (!type || strcmp(type, "object") != 0) {
        mesh_log(MESH_ERROR, "tool \"%s\": the input schema must be an object with \"type\": \"object\"", name);
        json_decref(schema);
        return -1;
    }
    if (s->ntools == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        struct tool *grown = realloc(s->tools, cap * sizeof *grown);
        if (!grown) mesh__out_of_memory();
        s->tools = grown;
        s->cap = cap;
    }
    json_t *def = mesh__need(json_object());
    put(def, "name", json_string(name));
    if (description) put(def, "description", json_string(description));
    put(def, "inputSchema", schema);
    struct tool *t = &s->tools[s->ntools];
    t->name = strdup(name);
    if (!t->name) mesh__out_of_memory();
    t->definition = def;
    t->handler = handler;
    t->userdata = userdata;
    s->ntools++;
    return 0;
}

/* ---- results ------------------------------------------------------------------------------ */

static void add_text(mesh_result *r, const char *text) {
    json_t *str = json_string(text);
    if (!str) { /* the one way json_string fails besides memory; refuse rather than send bad JSON */
        mesh_log(MESH_ERROR, "a tool's result text is not valid UTF-8; answering with an error");
        r->is_error = 1;
        str = json_string("the tool produced text that is not valid UTF-8");
    }
    json_t *block = mesh__need(json_object());
    put(block, "type", json_string("text"));
    put(block, "text", str);
    if (json_array_append_new(r->content, block) != 0) mesh__out_of_memory();
}

void mesh_result_text(mesh_result *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *text = vformat(fmt, ap);
    va_end(ap);
    add_text(r, text ? text : "");
    free(text);
}

void mesh_result_error(mesh_result *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *text = vformat(fmt, ap);
    va_end(ap);
    r->is_error = 1;
    add_text(r, text ? text : "");
    free(text);
}

void mesh_result_structured(mesh_result *r, json_t *object) {
    if (!json_is_object(object)) { /* MCP's structuredContent is an object, nothing else */
        json_decref(object);
        mesh_result_error(r, "the tool's structured result is not a JSON object");
        return;
    }
    json_decref(r->structured);
    r->structured = object;
}

/* The CallToolResult; consumes r's values. */
static json_t *finish_result(mesh_result *r) {
    if (r->structured && json_array_size(r->content) == 0) {
        char *text = json_dumps(r->structured, JSON_COMPACT);
        if (!text) mesh__out_of_memory();
        add_text(r, text);
        free(text);
    }
    json_t *result = mesh__need(json_object());
    put(result, "content", r->content);
    if (r->structured) put(result, "structuredContent", r->structured);
    put(result, "isError", json_boolean(r->is_error));
    return result;
}

/* ---- JSON-RPC ----------------------------------------------------------------------------- */

static json_t *reply_base(json_t *id) {
    json_t *reply = mesh__need(json_object());
    put(reply, "jsonrpc", json_string("2.0"));
    put(reply, "id", id ? json_incref(id) : json_null());
    return reply;
}

static json_t *result_reply(json_t *id, json_t *result) {
    json_t *reply = reply_base(id);
    put(reply, "result", result);
    return reply;
}

static json_t *error_reply(json_t *id, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static json_t *error_reply(json_t *id, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *text = vformat(fmt, ap);
    va_end(ap);
    json_t *message = json_string(text ? text : "");
    free(text);
    if (!message) message = json_string("the message about this error was not UTF-8");
    json_t *error = mesh__need(json_object());
    put(error, "code", json_integer(code));
    put(error, "message", message);
    json_t *reply = reply_base(id);
    put(reply, "error", error);
    return reply;
}

static json_t *initialize(mesh_server *s, json_t *params) {
    const char *asked = json_string_value(json_object_get(params, "protocolVersion"));
    const char *answer = LATEST_PROTOCOL;
    for (size_t i = 0; asked && i < sizeof PROTOCOLS / sizeof *PROTOCOLS; i++)
        if (strcmp(asked, PROTOCOLS[i]) == 0) answer = PROTOCOLS[i];
    mesh_log(MESH_DEBUG, "initialize: client asked for %s, answering %s", asked ? asked : "(none)", answer);
    json_t *tools = mesh__need(json_object());
    put(tools, "listChanged", json_false());
    json_t *capabilities = mesh__need(json_object());
    put(capabilities, "tools", tools);
    json_t *info = mesh__need(json_object());
    put(info, "name", json_string(s->name));
    put(info, "version", json_string(s->version));
    json_t *result = mesh__need(json_object());
    put(result, "protocolVersion", json_string(answer));
    put(result, "capabilities", capabilities);
    put(result, "serverInfo", info);
    return result;
}

static json_t *list_tools(mesh_server *s) {
    json_t *tools = mesh__need(json_array());
    for (size_t i = 0; i < s->ntools; i++)
        if (json_array_append(tools, s->tools[i].definition) != 0) mesh__out_of_memory();
    json_t *result = mesh__need(json_object());
    put(result, "tools", tools);
    return result;
}

/* The call's reply, or NULL when it was cancelled (MCP: a cancelled request gets no answer). */
static json_t *call_tool(struct loop *lp, json_t *id, json_t *params) {
    json_t *name = json_object_get(params, "name");
    if (!json_is_string(name)) return error_reply(id, INVALID_PARAMS, "tools/call needs params.name, a string");
    json_t *args = json_object_get(params, "arguments");
    if (args && !json_is_object(args) && !json_is_null(args))
        return error_reply(id, INVALID_PARAMS, "tools/call params.arguments must be an object");
    struct tool *t = find_tool(lp->server, json_string_value(name), json_string_length(name));
    if (!t) return error_reply(id, INVALID_PARAMS, "Unknown tool: %s", json_string_value(name));
    mesh_result r = {.content = mesh__need(json_array())};
    mesh__call_begin(lp, &r, id, params);
    if (!mesh__cancel_pending(lp, id)) { /* cancelled before it started: never run */
        json_t *empty = json_is_object(args) ? NULL : mesh__need(json_object());
        t->handler(empty ? empty : args, &r, t->userdata);
        json_decref(empty);
        fflush(stdout); /* stray printf()s of the tool reach the log now, not at exit */
    }
    mesh__call_end(&r);
    json_t *result = finish_result(&r);
    if (mesh_call_cancelled(&r)) { /* also when the handler never asked: the cancel may be waiting */
        mesh_log(MESH_DEBUG, "tools/call %s cancelled: no reply", json_string_value(name));
        json_decref(result);
        return NULL;
    }
    return result_reply(id, result);
}

/* The reply to one message, or NULL when none is due (notifications, stray responses). */
static json_t *handle(struct loop *lp, json_t *msg) {
    if (!json_is_object(msg))
        return error_reply(NULL, INVALID_REQUEST,
                           json_is_array(msg) ? "batches are not supported: send one message per line"
                                              : "a JSON-RPC message is an object");
    json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    int id_ok = json_is_string(id) || json_is_integer(id); /* MCP ids: string or integer, never null */
    if (!method) {
        /* an elicitation's answer was taken by its mesh_call_elicit (call.c); any other is stray */
        if (json_object_get(msg, "result") || json_object_get(msg, "error")) return NULL;
        return error_reply(id_ok ? id : NULL, INVALID_REQUEST, "a request needs a \"method\" string");
    }
    if (!id) { /* a notification: never answered; a cancel's call is over by now (see call.c) */
        mesh_log(MESH_DEBUG, "notification %s", method);
        if (strcmp(method, "notifications/cancelled") == 0) mesh__cancel_reached(lp, json_object_get(msg, "params"));
        return NULL;
    }
    if (!id_ok) return error_reply(NULL, INVALID_REQUEST, "\"id\" must be a string or an integer");
    const char *version = json_string_value(json_object_get(msg, "jsonrpc"));
    if (!version || strcmp(version, "2.0") != 0) return error_reply(id, INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\"");
    json_t *params = json_object_get(msg, "params");
    if (params && !json_is_object(params)) return error_reply(id, INVALID_PARAMS, "\"params\" must be an object");

    if (strcmp(method, "initialize") == 0) return result_reply(id, initialize(lp->server, params));
    if (strcmp(method, "ping") == 0) return result_reply(id, mesh__need(json_object()));
    if (strcmp(method, "tools/list") == 0) return result_reply(id, list_tools(lp->server));
    if (strcmp(method, "tools/call") == 0) return call_tool(lp, id, params);
    return error_reply(id, METHOD_NOT_FOUND, "Method not found: %s", method);
}

int mesh__send(FILE *out, json_t *msg) {
    int bad = json_dumpf(msg, out, JSON_COMPACT) != 0 || fputc('\n', out) == EOF || fflush(out) != 0;
    json_decref(msg);
    if (bad) mesh_log(MESH_ERROR, "cannot write to stdout: %s", strerror(errno));
    return bad ? -1 : 0;
}

int mesh_serve_stdio(mesh_server *s) {
    /* The protocol gets a private copy of stdout; fd 1 then points at stderr, so tool code that
     * prints cannot break a reply. */
    fflush(stdout);
    int fd = dup(STDOUT_FILENO);
    FILE *out = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!out || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        mesh_log(MESH_ERROR, "cannot set up stdout for the protocol: %s", strerror(errno));
        if (out) fclose(out);
        else if (fd >= 0) close(fd);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* a runtime gone away is a write error to report, not a silent death */

    struct loop lp = {.server = s, .out = out};
    char *line;
    size_t n;
    int got, rc = 0;
    while ((got = mesh__input_line(&lp.in, &line, &n)) > 0) {
        while (n > 0 && line[n - 1] == '\r') n--;
        if (n == 0) continue;
        json_error_t err;
        /* DECODE_ANY: a bare value is an invalid request, not a parse error; ALLOW_NUL: "\u0000" is valid JSON. */
        json_t *msg = json_loadb(line, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        json_t *reply;
        if (msg) {
            reply = handle(&lp, msg);
            json_decref(msg);
        } else {
            mesh_log(MESH_WARN, "a line that is not JSON: %s (column %d)", err.text, err.column);
            reply = error_reply(NULL, PARSE_ERROR, "Parse error: %s", err.text);
        }
        if (reply && mesh__send(out, reply) != 0) {
            rc = 1;
            break;
        }
    }
    if (rc == 0 && got < 0) {
        mesh_log(MESH_ERROR, "cannot read stdin: %s", strerror(errno));
        rc = 1;
    }
    mesh__loop_free(&lp);
    fflush(stdout);
    dup2(fileno(out), STDOUT_FILENO); /* give the caller its stdout back */
    fclose(out);
    return rc;
}
