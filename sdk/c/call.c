/* The call side of the C SDK's loop (see mesh.h and README.md): reading stdin, so that a handler
 * can look ahead for its own notifications/cancelled, and the caller and progress of a call.
 *
 * The loop is single-threaded: while a handler runs nobody reads stdin, so a cancel would wait
 * behind the handler it is meant to stop. mesh_call_cancelled() therefore reads what is waiting
 * (never blocking) into the same buffer the loop takes its lines from, notes every cancel it
 * sees, and leaves the lines for the loop to serve afterwards, in order.
 */
#define _GNU_SOURCE /* memmem */

#include "internal.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READ_CHUNK 65536
#define LOOKAHEAD_MAX (16u << 20) /* bytes waiting in the buffer past which a handler stops reading ahead */
#define CANCELLED "notifications/cancelled"

/* ---- input ------------------------------------------------------------------------------- */

/* One read() into the buffer: >0 bytes, 0 at end of input, -1 on error (errno). */
static ssize_t input_fill(struct input *in) {
    if (in->start > 0) { /* drop what was handed out; what is left moves to the front */
        memmove(in->buf, in->buf + in->start, in->len - in->start);
        in->len -= in->start;
        in->searched -= in->start;
        in->scanned = in->scanned > in->start ? in->scanned - in->start : 0;
        in->start = 0;
    }
    if (in->cap - in->len < READ_CHUNK / 2) { /* grows as needed: no line is too long */
        size_t cap = in->cap ? in->cap * 2 : READ_CHUNK;
        char *grown = realloc(in->buf, cap);
        if (!grown) mesh__out_of_memory();
        in->buf = grown;
        in->cap = cap;
    }
    ssize_t n;
    do n = read(STDIN_FILENO, in->buf + in->len, in->cap - in->len);
    while (n < 0 && errno == EINTR);
    if (n == 0) in->eof = 1;
    if (n > 0) in->len += (size_t)n;
    return n;
}

int mesh__input_line(struct input *in, char **line, size_t *n) {
    for (;;) {
        char *nl = in->len > in->searched ? memchr(in->buf + in->searched, '\n', in->len - in->searched) : NULL;
        size_t end = nl ? (size_t)(nl - in->buf) : in->len;
        if (nl || (in->eof && in->start < in->len)) { /* a last line without a newline counts too */
            *line = in->buf + in->start;
            *n = end - in->start;
            in->start = in->searched = nl ? end + 1 : end;
            return 1;
        }
        in->searched = in->len;
        if (in->eof) return 0;
        if (input_fill(in) < 0) return -1;
    }
}

/* ---- cancels read ahead ------------------------------------------------------------------- */

static int index_of(struct loop *lp, json_t *id) {
    for (size_t i = 0; i < lp->ncancels; i++)
        if (json_equal(lp->cancels[i], id)) return (int)i;
    return -1;
}

static void forget(struct loop *lp, size_t i) {
    json_decref(lp->cancels[i]);
    memmove(&lp->cancels[i], &lp->cancels[i + 1], (lp->ncancels - i - 1) * sizeof *lp->cancels);
    lp->ncancels--;
}

/* A line holding "notifications/cancelled": note its request id. */
static void note_cancel(struct loop *lp, const char *line, size_t n) {
    json_t *msg = json_loadb(line, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    const char *method = json_string_value(json_object_get(msg, "method"));
    json_t *id = json_object_get(json_object_get(msg, "params"), "requestId");
    if (method && strcmp(method, CANCELLED) == 0 && (json_is_string(id) || json_is_integer(id)) && index_of(lp, id) < 0) {
        if (lp->ncancels == MESH_CANCELS_MAX) {
            mesh_log(MESH_WARN, "more than %d cancels read ahead; the oldest may still be answered", MESH_CANCELS_MAX);
            forget(lp, 0);
        }
        lp->cancels[lp->ncancels++] = json_incref(id);
    }
    json_decref(msg);
}

/* While an elicit waits: a line that is the response to its request is its answer. The line
 * stays in the buffer; the loop ignores responses when it reaches it. */
static void note_answer(struct loop *lp, const char *line, size_t n) {
    json_t *msg = json_loadb(line, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    json_t *id = json_object_get(msg, "id");
    if (json_is_integer(id) && json_integer_value(id) == lp->awaiting && !json_object_get(msg, "method")
        && (json_object_get(msg, "result") || json_object_get(msg, "error"))) {
        lp->answer = msg;
        return;
    }
    json_decref(msg);
}

/* Look at the complete lines not looked at yet. */
static void scan(struct loop *lp) {
    struct input *in = &lp->in;
    size_t from = in->scanned > in->start ? in->scanned : in->start;
    char *nl;
    while ((nl = memchr(in->buf + from, '\n', in->len - from)) != NULL) {
        size_t n = (size_t)(nl - in->buf) - from;
        if (memmem(in->buf + from, n, CANCELLED, sizeof CANCELLED - 1)) note_cancel(lp, in->buf + from, n);
        /* not `else`: an answer may hold that text too; note_cancel checks the method */
        if (lp->awaiting && !lp->answer) note_answer(lp, in->buf + from, n);
        from += n + 1;
    }
    in->scanned = from;
}

/* Read what is waiting on stdin, never blocking, and note the cancels in it. */
static void look_ahead(struct loop *lp) {
    struct input *in = &lp->in;
    if (in->buf) scan(lp);
    while (!in->eof && in->len - in->start < LOOKAHEAD_MAX) {
        struct pollfd ready = {.fd = STDIN_FILENO, .events = POLLIN};
        if (poll(&ready, 1, 0) <= 0 || input_fill(in) <= 0) return; /* nothing waiting; an error is the loop's to report */
        scan(lp);
    }
}

int mesh__cancel_pending(struct loop *lp, json_t *id) {
    return index_of(lp, id) >= 0;
}

void mesh__cancel_reached(struct loop *lp, json_t *params) {
    int i = index_of(lp, json_object_get(params, "requestId"));
    if (i >= 0) forget(lp, (size_t)i);
}

int mesh_call_cancelled(mesh_result *r) {
    if (!r->cancelled && r->loop) {
        look_ahead(r->loop);
        r->cancelled = mesh__cancel_pending(r->loop, r->id);
    }
    return r->cancelled;
}

void mesh__loop_free(struct loop *lp) {
    while (lp->ncancels) forget(lp, lp->ncancels - 1);
    json_decref(lp->answer); /* NULL unless an elicit stopped waiting abnormally */
    free(lp->in.buf);
}

/* ---- the caller --------------------------------------------------------------------------- */

/* Why the caller's field `key` is not acceptable, or NULL with *out set (NULL for a missing or
 * null optional one). */
static const char *caller_text(json_t *fields, const char *key, int optional, const char **out) {
    json_t *v = json_object_get(fields, key);
    *out = NULL;
    if (!v || json_is_null(v)) return optional ? NULL : "is missing";
    if (!json_is_string(v)) return "is not a string";
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n == 0) return "is empty";
    if (n > MESH_CALLER_FIELD_MAX) return "is longer than 256 bytes";
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return "holds control characters";
    *out = s;
    return NULL;
}

/* Append `text` escaped ('%', '/', ':' as %25, %2F, %3A: every SDK's rule) at out[*at]; the
 * buffer is sized for the longest two fields (internal.h). */
static void put_escaped(char *out, size_t *at, const char *text) {
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '%' || *p == '/' || *p == ':') {
            out[(*at)++] = '%';
            out[(*at)++] = hex[*p >> 4];
            out[(*at)++] = hex[*p & 15];
        } else {
            out[(*at)++] = (char)*p;
        }
    }
    out[*at] = '\0';
}

static void put_text(char *out, size_t *at, const char *text) {
    size_t n = strlen(text);
    memcpy(out + *at, text, n + 1);
    *at += n;
}

static int is_delegate(const char *via) {
    return !strcmp(via, "mcp") || !strcmp(via, "console");
}

static void read_caller(mesh_result *r, json_t *meta) {
    json_t *fields = json_object_get(meta, "mesh/caller");
    if (!fields) return;
    if (!json_is_object(fields)) {
        mesh_log(MESH_WARN, "mesh/caller is not an object; the handler gets no caller");
        return;
    }
    struct mesh_caller *c = &r->caller_storage;
    static const char *const keys[] = {"account", "user", "name"};
    const char **slots[] = {&c->account, &c->user, &c->name};
    const char *key = NULL, *why = NULL;
    for (size_t i = 0; !why && i < 3; i++) why = caller_text(fields, key = keys[i], i > 0, slots[i]);
    c->via = json_string_value(json_object_get(fields, "via"));
    if (!why && !(c->via && (!strcmp(c->via, "bus") || !strcmp(c->via, "local") || is_delegate(c->via))))
        key = "via", why = "is not one of bus, local, mcp, console";
    c->person = NULL;
    json_t *person = json_object_get(fields, "person");
    if (!why && person && !json_is_null(person)) {
        struct mesh_person *p = &r->person_storage;
        static const char *const pkeys[] = {"person.iss", "person.sub", "person.name"};
        const char **pslots[] = {&p->iss, &p->sub, &p->name};
        if (!is_delegate(c->via)) key = "person", why = "comes only with via mcp or console";
        else if (!json_is_object(person)) key = "person", why = "is not an object";
        for (size_t i = 0; !why && i < 3; i++)
            why = caller_text(person, pkeys[i] + 7, 0, pslots[i]), key = pkeys[i];
        if (!why) c->person = p;
    }
    if (why) {
        mesh_log(MESH_WARN, "mesh/caller is malformed: %s %s; the handler gets no caller", key, why);
        return;
    }
    size_t at = 0;
    char *id = r->caller_id;
    id[0] = '\0';
    if (c->person) {
        put_text(id, &at, "person:");
        put_escaped(id, &at, c->person->iss);
        put_text(id, &at, "/");
        put_escaped(id, &at, c->person->sub);
    } else {
        if (!strcmp(c->via, "local")) put_text(id, &at, "local:");
        put_escaped(id, &at, c->account);
        if (c->user) put_text(id, &at, "/"), put_escaped(id, &at, c->user);
    }
    c->id = id;
    r->caller = c;
}

const struct mesh_caller *mesh_call_caller(const mesh_result *r) {
    return r->caller;
}

void mesh__call_begin(struct loop *lp, mesh_result *r, json_t *id, json_t *params) {
    json_t *meta = json_object_get(params, "_meta");
    json_t *token = json_object_get(meta, "progressToken");
    r->loop = lp;
    r->id = id;
    r->progress_token = json_is_string(token) || json_is_integer(token) ? token : NULL;
    json_t *ref = json_object_get(meta, "mesh/call");
    r->call_ref = json_is_integer(ref) ? ref : NULL; /* jansson's booleans are not integers */
    read_caller(r, meta);
}

/* ---- progress ----------------------------------------------------------------------------- */

int mesh_call_progress(mesh_result *r, double progress, double total, const char *message) {
    json_t *text = message ? json_string(message) : NULL;
    if (!isfinite(progress) || !isfinite(total) || (message && !text)) {
        json_decref(text);
        errno = EINVAL;
        return -1;
    }
    if (!r->loop || !r->progress_token || r->cancelled) {
        json_decref(text);
        return 0;
    }
    json_t *params = mesh__need(json_pack("{s:O, s:f}", "progressToken", r->progress_token, "progress", progress));
    if (total > 0 && json_object_set_new(params, "total", mesh__need(json_real(total))) != 0) mesh__out_of_memory();
    if (text && json_object_set_new(params, "message", text) != 0) mesh__out_of_memory();
    json_t *note = mesh__need(json_pack("{s:s, s:s, s:o}", "jsonrpc", "2.0", "method", "notifications/progress", "params", params));
    if (mesh__send(r->loop->out, note) != 0) {
        errno = EIO;
        return -1;
    }
    return 0;
}

/* ---- asking (elicitation) ----------------------------------------------------------------- */

/* Keep `value` as long as the call (the answer's strings point into it); returns it. */
static json_t *keep(mesh_result *r, json_t *value) {
    if (!r->kept) r->kept = mesh__need(json_array());
    if (json_array_append_new(r->kept, mesh__need(value)) != 0) mesh__out_of_memory();
    return value;
}

void mesh__call_end(mesh_result *r) {
    json_decref(r->kept);
    r->kept = NULL;
}

static int fail(struct mesh_elicit_answer *out, const char *why) {
    out->action = MESH_ELICIT_CANCEL; /* nobody said yes */
    out->content = NULL;
    out->error = why;
    return -1;
}

/* Block until the response to request `request_id` is read: it, or NULL with *why set. Every other line
 * stays in the buffer for the loop; cancels are noted as they pass, as in look_ahead(). */
static json_t *await_answer(mesh_result *r, json_int_t request_id, const char **why) {
    struct loop *lp = r->loop;
    struct input *in = &lp->in;
    lp->awaiting = request_id;
    *why = NULL;
    while (!lp->answer && !*why) {
        if (in->buf) scan(lp);
        if (lp->answer) break;
        if (mesh__cancel_pending(lp, r->id)) r->cancelled = 1, *why = "the call was cancelled while it asked";
        else if (in->eof) *why = "stdin closed before the answer came";
        else if (in->len - in->start >= LOOKAHEAD_MAX) *why = "more than 16 MiB arrived on stdin before the answer";
        else if (input_fill(in) < 0) *why = "cannot read stdin"; /* read() blocks: this is the wait */
    }
    json_t *answer = lp->answer;
    lp->answer = NULL;
    lp->awaiting = 0;
    return answer;
}

/* Send elicitation/create with `params` (consumed), wait, and read the answer into `out`. */
static int ask(mesh_result *r, json_t *params, struct mesh_elicit_answer *out) {
    if (!r->loop || r->cancelled) {
        json_decref(params);
        return fail(out, r->loop ? "the call is cancelled" : "not inside a call");
    }
    if (r->call_ref) { /* the node's way to tell which call asks */
        json_t *meta = mesh__need(json_pack("{s:O}", "mesh/call", r->call_ref));
        if (json_object_set_new(params, "_meta", meta) != 0) mesh__out_of_memory();
    }
    json_int_t id = ++r->loop->asks;
    json_t *request = mesh__need(json_pack("{s:s, s:I, s:s, s:o}", "jsonrpc", "2.0", "id", id, "method",
                                           "elicitation/create", "params", params));
    if (mesh__send(r->loop->out, request) != 0) return fail(out, "cannot write to stdout");
    const char *why;
    json_t *answer = await_answer(r, id, &why);
    if (!answer) return fail(out, why);
    keep(r, answer);
    json_t *error = json_object_get(answer, "error");
    if (error) {
        const char *message = json_string_value(json_object_get(error, "message"));
        return fail(out, message ? message : "the client answered with an error");
    }
    json_t *result = json_object_get(answer, "result");
    const char *action = json_string_value(json_object_get(result, "action"));
    json_t *content = json_object_get(result, "content");
    out->error = NULL;
    out->content = NULL;
    if (action && !strcmp(action, "decline")) out->action = MESH_ELICIT_DECLINE;
    else if (action && !strcmp(action, "cancel")) out->action = MESH_ELICIT_CANCEL;
    else if (action && !strcmp(action, "accept")) out->action = MESH_ELICIT_ACCEPT;
    else return fail(out, "the client's answer has no action accept, decline or cancel");
    if (out->action == MESH_ELICIT_ACCEPT && json_is_object(content)) {
        char *text = json_dumps(content, JSON_COMPACT);
        if (!text) mesh__out_of_memory();
        out->content = json_string_value(keep(r, json_string(text))); /* jansson's output is UTF-8 */
        free(text);
    }
    return 0;
}

/* A JSON string of `text`, or NULL when it is NULL or not UTF-8. */
static json_t *text_or_null(const char *text) {
    return text ? json_string(text) : NULL;
}

int mesh_call_elicit(mesh_result *r, const char *message, const char *schema_json, struct mesh_elicit_answer *out) {
    json_t *text = text_or_null(message);
    json_t *schema = schema_json ? json_loads(schema_json, 0, NULL) : NULL;
    const char *type = json_string_value(json_object_get(schema, "type"));
    if (!text || !type || strcmp(type, "object") != 0) {
        json_decref(text);
        json_decref(schema);
        return fail(out, "mesh_call_elicit needs a UTF-8 message and a schema that is an object of type \"object\"");
    }
    return ask(r, mesh__need(json_pack("{s:s, s:o, s:o}", "mode", "form", "message", text, "requestedSchema", schema)), out);
}

int mesh_call_elicit_url(mesh_result *r, const char *message, const char *url, const char *elicitation_id,
                         struct mesh_elicit_answer *out) {
    json_t *text = text_or_null(message), *link = text_or_null(url), *name = text_or_null(elicitation_id);
    if (!text || !link || !name) {
        json_decref(text);
        json_decref(link);
        json_decref(name);
        return fail(out, "mesh_call_elicit_url needs a UTF-8 message, url and elicitation id");
    }
    int rc = ask(r, mesh__need(json_pack("{s:s, s:o, s:o, s:o}", "mode", "url", "message", text, "url", link,
                                         "elicitationId", name)), out);
    out->content = NULL; /* URL mode carries no content, whatever a client sent */
    return rc;
}
