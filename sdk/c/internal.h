/* What mesh.c (the loop, tools, results) and call.c (input, the call's caller, cancellation and
 * progress) share inside the C SDK. Not API: bundles include mesh.h only. */
#ifndef MESH_INTERNAL_H
#define MESH_INTERNAL_H

#include <stdio.h>

#include "mesh.h"

/* Requests whose notifications/cancelled was read ahead while a handler ran, kept until the loop
 * reaches that notification; when more are pending, the oldest is forgotten (and logged). */
#define MESH_CANCELS_MAX 64

/* stdin (fd 0) read by the SDK itself, so a handler can look ahead for its cancel without
 * losing what it reads: lines are handed out from `buf` in order. */
struct input {
    char *buf;
    size_t start;    /* first byte not handed out yet */
    size_t searched; /* no newline in [start, searched) */
    size_t scanned;  /* complete lines before this were looked at for cancels */
    size_t len, cap;
    int eof;
};

struct loop {
    mesh_server *server;
    FILE *out; /* the protocol's private copy of stdout */
    struct input in;
    json_t *cancels[MESH_CANCELS_MAX]; /* request ids, oldest first */
    size_t ncancels;
    json_int_t asks;     /* ids of our own requests (elicitations): 1, 2, ... */
    json_int_t awaiting; /* the id whose response mesh_call_elicit waits for, 0 when none */
    json_t *answer;      /* that response once read, until the waiting elicit takes it */
};

struct mesh_result {
    json_t *content;    /* array of content blocks */
    json_t *structured; /* object or NULL */
    int is_error;
    /* the call this result answers */
    struct loop *loop;
    json_t *id;
    json_t *progress_token; /* borrowed from the request; NULL without one */
    json_t *call_ref;       /* _meta["mesh/call"], an integer borrowed from the request; NULL without one */
    json_t *kept;           /* the answers of this call's elicitations, whose strings live as long as it; or NULL */
    int cancelled;
    const struct mesh_caller *caller; /* &caller_storage, or NULL */
    struct mesh_caller caller_storage;
    struct mesh_person person_storage;
    /* "person:" or "local:", two names escaped (each byte at most 3), the "/" and the NUL. */
    char caller_id[8 + 6 * MESH_CALLER_FIELD_MAX + 2];
};

/* Out of memory has no useful recovery in a tools child: say so and let the runtime restart it. */
void mesh__out_of_memory(void) __attribute__((noreturn));
/* `value`, or out_of_memory() when it is NULL. */
json_t *mesh__need(json_t *value);
/* One message, one line on `out`; consumes msg. 0, or -1 (logged) when the write fails. */
int mesh__send(FILE *out, json_t *msg);

/* The next line (without its newline) from stdin, blocking for it: 1, 0 at the end, -1 on a
 * read error. The line lives in the input buffer until the next read. */
int mesh__input_line(struct input *in, char **line, size_t *n);
/* Fill in `r`'s call from the request (id and params borrowed for the call's duration). */
void mesh__call_begin(struct loop *lp, mesh_result *r, json_t *id, json_t *params);
/* The call is over: free what it kept for the handler. */
void mesh__call_end(mesh_result *r);
/* Whether a cancel for `id` was already read (the call must not run or be answered). */
int mesh__cancel_pending(struct loop *lp, json_t *id);
/* The loop reached a notifications/cancelled: its request is done with, forget its id. */
void mesh__cancel_reached(struct loop *lp, json_t *params);
void mesh__loop_free(struct loop *lp);

#endif /* MESH_INTERNAL_H */
