/* sandbox-probe in C: the same attempts as python/main.py, from a compiled child (no
 * interpreter between it and the kernel). Tool `attempt` takes {"arguments": "<JSON>"};
 * `sandbox-probe-c once` reads PROBE_ARGS, prints the outcomes as one JSON line and exits; `serve`
 * does the same and stays up (a service). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mesh.h"

static const char *err_name(int e) {
    const char *name = strerrorname_np(e);
    return name ? name : "?";
}

static const char *try_read(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_name(errno);
    char c;
    ssize_t n = read(fd, &c, 1);
    int e = errno;
    close(fd);
    return n < 0 ? err_name(e) : "ok";
}

static const char *try_write(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err_name(errno);
    ssize_t n = write(fd, "was here\n", 9);
    int e = errno;
    close(fd);
    return n != 9 ? err_name(e) : "ok";
}

static const char *try_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return err_name(errno);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect(fd, (struct sockaddr *)&to, sizeof to);
    int e = errno;
    close(fd);
    return rc != 0 ? err_name(e) : "ok";
}

static const char *try_unix(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return err_name(errno);
    struct sockaddr_un to = {.sun_family = AF_UNIX};
    snprintf(to.sun_path, sizeof to.sun_path, "%s", path);
    int rc = connect(fd, (struct sockaddr *)&to, sizeof to);
    int e = errno;
    close(fd);
    return rc != 0 ? err_name(e) : "ok";
}

static const char *try_ptrace(pid_t pid) {
    if (ptrace(PTRACE_ATTACH, pid, NULL, NULL) != 0) return err_name(errno);
    waitpid(pid, NULL, __WALL);
    ptrace(PTRACE_DETACH, pid, NULL, NULL);
    return "ok";
}

/* A pid argument: a number, or "parent" (the node that started this child). */
static pid_t pid_of(const json_t *value) {
    if (json_is_string(value) && !strcmp(json_string_value(value), "parent")) return getppid();
    return (pid_t)json_integer_value(value);
}

static json_t *limit(int resource) {
    struct rlimit r;
    if (getrlimit(resource, &r) != 0) return json_null();
    return r.rlim_cur == RLIM_INFINITY ? json_integer(-1) : json_integer((json_int_t)r.rlim_cur);
}

static json_t *probe(json_t *args) {
    json_t *out = json_object(), *group, *item;
    size_t i;
    static const char *const path_groups[] = {"read", "write", "unix"};
    for (size_t g = 0; g < 3; g++) {
        group = json_object();
        json_array_foreach(json_object_get(args, path_groups[g]), i, item) {
            const char *path = json_string_value(item);
            if (!path) continue;
            const char *said = g == 0 ? try_read(path) : g == 1 ? try_write(path) : try_unix(path);
            json_object_set_new(group, path, json_string(said));
        }
        json_object_set_new(out, path_groups[g], group);
    }
    group = json_object();
    json_array_foreach(json_object_get(args, "connect"), i, item) {
        char key[16];
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(item));
        json_object_set_new(group, key, json_string(try_connect((int)json_integer_value(item))));
    }
    json_object_set_new(out, "connect", group);
    json_t *limits = json_object();
    json_object_set_new(limits, "nofile", limit(RLIMIT_NOFILE));
    json_object_set_new(limits, "data", limit(RLIMIT_DATA));
    json_object_set_new(limits, "nproc", limit(RLIMIT_NPROC));
    json_object_set_new(limits, "core", limit(RLIMIT_CORE));
    json_object_set_new(out, "limits", limits);
    const char *tmpdir = getenv("TMPDIR");
    json_object_set_new(out, "tmpdir", json_string(tmpdir ? tmpdir : ""));
    const char *own = json_string_value(json_object_get(args, "read_own_c"));
    if (own) { /* a file of its own bundle, wherever the node runs it from */
        char path[4096];
        const char *dir = getenv("MESH_BUNDLE_DIR");
        snprintf(path, sizeof path, "%s/%s", dir ? dir : ".", own);
        json_object_set_new(out, "read_own", json_string(try_read(path)));
    }
    json_t *pid = json_object_get(args, "ptrace");
    if (json_is_integer(pid) || json_is_string(pid)) json_object_set_new(out, "ptrace", json_string(try_ptrace(pid_of(pid))));
    pid = json_object_get(args, "signal");
    if (json_is_integer(pid) || json_is_string(pid))
        json_object_set_new(out, "signal", json_string(kill(pid_of(pid), 0) == 0 ? "ok" : err_name(errno)));
    return out;
}

/* `once` and `serve` under a node: the outcomes also into $MESH_DATA_DIR/report-$MESH_BUNDLE.json,
 * where the test reads a step's or a service's (writing there is one of the outcomes). */
static void report(const char *dumped) {
    const char *data = getenv("MESH_DATA_DIR"), *bundle = getenv("MESH_BUNDLE");
    if (!data || !bundle) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/report-%s.json", data, bundle);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%s\n", dumped);
    fclose(f);
}

static void attempt(json_t *arguments, mesh_result *result, void *userdata) {
    (void)userdata;
    const char *text = json_string_value(json_object_get(arguments, "arguments"));
    json_t *args = text ? json_loads(text, 0, NULL) : NULL;
    if (!args) {
        mesh_result_error(result, "argument `arguments` must be a JSON object, as a string");
        return;
    }
    json_t *out = probe(args);
    char *dumped = json_dumps(out, JSON_COMPACT);
    mesh_result_text(result, "%s", dumped ? dumped : "{}");
    free(dumped);
    json_decref(out);
    json_decref(args);
}

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {\"arguments\": {\"type\": \"string\"}}, \"required\": [\"arguments\"]}";

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "once") || !strcmp(argv[1], "serve"))) {
        const char *text = getenv("PROBE_ARGS");
        json_t *args = json_loads(text ? text : "{}", 0, NULL);
        if (!args) return 2;
        json_t *out = probe(args);
        char *dumped = json_dumps(out, JSON_COMPACT);
        printf("%s\n", dumped ? dumped : "{}");
        fflush(stdout);
        report(dumped ? dumped : "{}");
        while (!strcmp(argv[1], "serve")) pause(); /* a service: up until it is stopped */
        return 0;
    }
    mesh_server *server = mesh_server_new("sandbox-probe-c", "0.1.0");
    if (!server) return 1;
    if (mesh_tool_add(server, "attempt", "Try what `arguments` names; the outcomes as JSON.", SCHEMA, attempt, NULL) != 0)
        return 1;
    int rc = mesh_serve_stdio(server);
    mesh_server_free(server);
    return rc;
}
