/* hello-c: one tool, `greet`, served over MCP stdio by the mesh's C SDK. */
#include "mesh.h"

static const char GREET_SCHEMA[] =
    "{\"type\": \"object\","
    " \"properties\": {\"name\": {\"type\": \"string\", \"description\": \"who to greet\"}},"
    " \"required\": [\"name\"]}";

static void greet(json_t *arguments, mesh_result *result, void *userdata) {
    (void)userdata;
    const json_t *name = json_object_get(arguments, "name");
    if (!name) {
        mesh_result_error(result, "missing argument `name`: say who to greet, e.g. {\"name\": \"Ada\"}");
        return;
    }
    if (!json_is_string(name)) {
        mesh_result_error(result, "argument `name` must be a string");
        return;
    }
    json_t *greeting = json_sprintf("Hello, %s! (c)", json_string_value(name));
    if (!greeting) {
        mesh_result_error(result, "could not build the greeting");
        return;
    }
    mesh_result_text(result, "%s", json_string_value(greeting));
    json_t *structured = json_object();
    json_object_set_new(structured, "greeting", greeting); /* takes greeting, even on failure */
    mesh_result_structured(result, structured);
}

int main(void) {
    struct mesh_facts facts;
    if (mesh_facts(&facts) != 0) return 1;
    mesh_server *server = mesh_server_new("hello-c", "0.1.0");
    if (!server) return 1;
    if (mesh_tool_add(server, "greet", "Greets someone by name.", GREET_SCHEMA, greet, NULL) != 0) {
        mesh_server_free(server);
        return 1;
    }
    mesh_log(MESH_INFO, "hello-c serving on node %s (C SDK %s)", facts.node[0] ? facts.node : "(none)", MESH_SDK_VERSION);
    int rc = mesh_serve_stdio(server);
    mesh_server_free(server);
    return rc;
}
