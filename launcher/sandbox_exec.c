/*
 * mesh-sandbox: confine one child of the node, then exec it in place (same pid).
 *
 * The node spawns this small program instead of the child (as it spawned util-linux setpriv
 * before): no Python runs between fork and exec, so Python keeps spawning with vfork, and
 * everything here costs a few system calls. It applies, in this order, and stops with exit
 * status 126 and one line on stderr naming the step if any asked-for step fails (a child is
 * never run less confined than the node was told):
 *
 *   1. the parent-death signal (SIGKILL), as setpriv --pdeathsig did;
 *   2. namespaces: a network namespace with no interface up (-N); when not root, a user
 *      namespace mapping the uid and gid to themselves (-U, and always with -N);
 *   3. resource limits (-l name=value), lowered only;
 *   4. every capability dropped from the bounding set and the ambient and inheritable sets, so
 *      a child of a root node runs as uid 0 with no capability at all;
 *   5. no_new_privs;
 *   6. Landlock (-L abi): read and execute beneath each -r path, read and write beneath each -w
 *      path, nothing else; TCP connect to the -c ports only and no TCP bind (ABI 4); no
 *      abstract unix sockets and no signals out of the sandbox (ABI 6);
 *   7. a seccomp filter (-S) answering EPERM to what a tool never needs (see deny[] below);
 *   8. execvp(program).
 *
 * `mesh-sandbox --probe` says what this kernel lets this user do, one line such as
 * "landlock=7 userns=ok netns=ok seccomp=ok" (an errno name instead of ok for what failed); the
 * launcher reads it once per user (launcher/sandbox.py).
 *
 * Written for Linux on x86_64 and aarch64; the Landlock and seccomp constants are spelled out
 * here so that an older distribution's headers build it for a newer kernel.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define MY_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define MY_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "mesh-sandbox knows the system call numbers of x86_64 and aarch64 only"
#endif

#define FAIL 126

/* ---- Landlock (include/uapi/linux/landlock.h) --------------------------------------------- */
#define LL_CREATE_RULESET 444
#define LL_ADD_RULE 445
#define LL_RESTRICT_SELF 446
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2

#define FS_EXECUTE (1ULL << 0)
#define FS_WRITE_FILE (1ULL << 1)
#define FS_READ_FILE (1ULL << 2)
#define FS_READ_DIR (1ULL << 3)
#define FS_REMOVE_DIR (1ULL << 4)
#define FS_REMOVE_FILE (1ULL << 5)
#define FS_MAKE_CHAR (1ULL << 6)
#define FS_MAKE_DIR (1ULL << 7)
#define FS_MAKE_REG (1ULL << 8)
#define FS_MAKE_SOCK (1ULL << 9)
#define FS_MAKE_FIFO (1ULL << 10)
#define FS_MAKE_BLOCK (1ULL << 11)
#define FS_MAKE_SYM (1ULL << 12)
#define FS_REFER (1ULL << 13)    /* ABI 2 */
#define FS_TRUNCATE (1ULL << 14) /* ABI 3 */
#define FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */
#define NET_BIND_TCP (1ULL << 0)  /* ABI 4 */
#define NET_CONNECT_TCP (1ULL << 1)
#define SCOPE_ABSTRACT_UNIX (1ULL << 0) /* ABI 6 */
#define SCOPE_SIGNAL (1ULL << 1)

/* The rights a rule on a file (not a folder) may carry. */
#define FS_FILE_RIGHTS (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV)

struct ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

struct ll_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

struct ll_net_port {
    uint64_t allowed_access;
    uint64_t port;
};

static int landlock_abi(void) {
    long abi = syscall(LL_CREATE_RULESET, NULL, 0, LL_CREATE_RULESET_VERSION);
    return abi < 0 ? 0 : (int)abi;
}

static uint64_t fs_handled(int abi) {
    uint64_t all = (FS_MAKE_SYM << 1) - 1; /* ABI 1: bits 0..12 */
    if (abi >= 2) all |= FS_REFER;
    if (abi >= 3) all |= FS_TRUNCATE;
    if (abi >= 5) all |= FS_IOCTL_DEV;
    return all;
}

/* ---- what the command line asked for ----------------------------------------------------- */
#define MAX_PATHS 256
#define MAX_PORTS 256
#define MAX_LIMITS 8

struct limit {
    int resource;
    rlim_t value;
};

struct plan {
    const char *read[MAX_PATHS];
    int nread;
    const char *write[MAX_PATHS];
    int nwrite;
    uint64_t ports[MAX_PORTS];
    int nports;
    struct limit limits[MAX_LIMITS];
    int nlimits;
    int abi;       /* Landlock ABI to use; 0: none */
    int netns;     /* a network namespace of its own */
    int userns;    /* a user namespace of its own (when not root) */
    int seccomp;   /* the filter */
    int inet;      /* AF_INET/AF_INET6 sockets allowed (the bundle declared network) */
    pid_t parent;  /* the node: if it is already gone, do not run at all */
    char **argv;   /* the program and its arguments */
};

static void die(const char *step, const char *what) {
    int e = errno;
    if (what)
        fprintf(stderr, "mesh-sandbox: %s %s: %s\n", step, what, strerror(e));
    else
        fprintf(stderr, "mesh-sandbox: %s: %s\n", step, strerror(e));
    _exit(FAIL);
}

static void usage(const char *why) {
    fprintf(stderr,
            "mesh-sandbox: %s\n"
            "usage: mesh-sandbox [-r PATH]... [-w PATH]... [-c PORT]... [-l NAME=VALUE]... [-L ABI] [-N] [-U] [-S] [-I]\n"
            "                    [-p PARENT_PID] -- PROGRAM [ARG]...\n"
            "       mesh-sandbox --probe\n",
            why);
    _exit(FAIL);
}

static long number(const char *text, long low, long high, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < low || v > high) {
        fprintf(stderr, "mesh-sandbox: %s %s is not a number from %ld to %ld\n", what, text, low, high);
        _exit(FAIL);
    }
    return v;
}

static void parse_limit(struct plan *p, const char *arg) {
    static const struct {
        const char *name;
        int resource;
    } names[] = {{"nofile", RLIMIT_NOFILE}, {"nproc", RLIMIT_NPROC}, {"data", RLIMIT_DATA},
                 {"as", RLIMIT_AS},         {"core", RLIMIT_CORE},   {"fsize", RLIMIT_FSIZE}};
    const char *eq = strchr(arg, '=');
    if (!eq) usage("-l wants NAME=VALUE");
    if (p->nlimits >= MAX_LIMITS) usage("too many -l");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strlen(names[i].name) == (size_t)(eq - arg) && !strncmp(arg, names[i].name, eq - arg)) {
            p->limits[p->nlimits].resource = names[i].resource;
            p->limits[p->nlimits].value = (rlim_t)number(eq + 1, 0, 0x7fffffffffffffffL, "limit");
            p->nlimits++;
            return;
        }
    }
    usage("-l knows nofile, nproc, data, as, core, fsize");
}

static void parse(struct plan *p, int argc, char **argv) {
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == 0 || a[2] != 0) usage("unknown argument");
        char opt = a[1];
        if (opt == 'N') { p->netns = 1; continue; }
        if (opt == 'S') { p->seccomp = 1; continue; }
        if (opt == 'I') { p->inet = 1; continue; }
        if (opt == 'U') { p->userns = 1; continue; }
        if (i + 1 >= argc) usage("an option misses its value");
        const char *v = argv[++i];
        switch (opt) {
        case 'r':
            if (p->nread >= MAX_PATHS) usage("too many -r");
            p->read[p->nread++] = v;
            break;
        case 'w':
            if (p->nwrite >= MAX_PATHS) usage("too many -w");
            p->write[p->nwrite++] = v;
            break;
        case 'c':
            if (p->nports >= MAX_PORTS) usage("too many -c");
            p->ports[p->nports++] = (uint64_t)number(v, 1, 65535, "port");
            break;
        case 'l': parse_limit(p, v); break;
        case 'L': p->abi = (int)number(v, 0, 1000, "Landlock ABI"); break;
        case 'p': p->parent = (pid_t)number(v, 1, 0x7fffffff, "parent pid"); break;
        default: usage("unknown option");
        }
    }
    if (i >= argc) usage("no program after --");
    p->argv = argv + i;
}

/* ---- the steps --------------------------------------------------------------------------- */
static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die("open", path);
    ssize_t n = write(fd, text, strlen(text));
    if (n != (ssize_t)strlen(text)) die("write", path);
    close(fd);
}

/* -N: a network namespace with nothing in it. -U, when not root: a user namespace that maps this
 * uid and gid to themselves (file access is unchanged): an unprivileged network namespace needs
 * one, and inside one RLIMIT_NPROC counts this child's own processes, not every process of its
 * uid. Root needs none (and RLIMIT_NPROC never applies to uid 0). */
static int map_self(int quiet) {
    uid_t uid = geteuid();
    gid_t gid = getegid();
    char map[64];
    if (unshare(CLONE_NEWUSER) != 0) {
        if (quiet) return -1;
        die("unshare", "(user namespace)");
    }
    write_file("/proc/self/setgroups", "deny");
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
    write_file("/proc/self/uid_map", map);
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
    write_file("/proc/self/gid_map", map);
    return 0;
}

static int new_netns(int quiet) {
    if (unshare(CLONE_NEWNET) == 0) return 0;
    if (quiet) return -1;
    die("unshare", "(network namespace)");
    return -1;
}

static void namespaces(const struct plan *p) {
    if ((p->userns || p->netns) && geteuid() != 0) map_self(0);
    if (p->netns) new_netns(0);
}

static void apply_limits(const struct plan *p) {
    for (int i = 0; i < p->nlimits; i++) {
        struct rlimit now;
        if (getrlimit(p->limits[i].resource, &now) != 0) die("getrlimit", NULL);
        rlim_t v = p->limits[i].value;
        /* Lower only: a limit above the node's own hard limit is the node's limit. */
        if (now.rlim_max != RLIM_INFINITY && v > now.rlim_max) v = now.rlim_max;
        struct rlimit want = {v, v};
        if (setrlimit(p->limits[i].resource, &want) != 0) die("setrlimit", NULL);
    }
}

static void drop_capabilities(void) {
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &head, data) != 0) die("capget", NULL);
    /* Without CAP_SETPCAP (a non-root node without a user namespace) there is nothing to drop:
     * exec gives a non-root program no capability. */
    if (data[0].effective & (1U << CAP_SETPCAP)) {
        for (int cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++) {
            if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) die("prctl", "(capability bounding set)");
        }
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        die("prctl", "(ambient capabilities)");
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &head, data) != 0) die("capset", NULL);
}

static int add_path(int ruleset, const char *path, uint64_t want, uint64_t handled) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR || errno == EACCES) return 0; /* nothing there to allow */
        die("open", path);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) die("stat", path);
    uint64_t allowed = want & handled;
    if (!S_ISDIR(st.st_mode)) allowed &= FS_FILE_RIGHTS;
    struct ll_path_beneath rule = {allowed, fd};
    if (allowed && syscall(LL_ADD_RULE, ruleset, LL_RULE_PATH_BENEATH, &rule, 0) != 0) die("landlock_add_rule", path);
    close(fd);
    return 0;
}

static void apply_landlock(const struct plan *p) {
    uint64_t fs = fs_handled(p->abi);
    struct ll_ruleset_attr attr = {fs, 0, 0};
    if (p->abi >= 4) attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP;
    if (p->abi >= 6) attr.scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL;
    size_t size = p->abi >= 6 ? sizeof attr : p->abi >= 4 ? offsetof(struct ll_ruleset_attr, scoped)
                                                          : offsetof(struct ll_ruleset_attr, handled_access_net);
    int ruleset = (int)syscall(LL_CREATE_RULESET, &attr, size, 0);
    if (ruleset < 0) die("landlock_create_ruleset", NULL);
    const uint64_t read_exec = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR;
    /* Read-write: everything but making device nodes (which needs a capability anyway). */
    const uint64_t read_write = fs & ~(FS_MAKE_CHAR | FS_MAKE_BLOCK);
    for (int i = 0; i < p->nread; i++) add_path(ruleset, p->read[i], read_exec, fs);
    for (int i = 0; i < p->nwrite; i++) add_path(ruleset, p->write[i], read_write, fs);
    if (p->abi >= 4) {
        for (int i = 0; i < p->nports; i++) {
            struct ll_net_port rule = {NET_CONNECT_TCP, p->ports[i]};
            if (syscall(LL_ADD_RULE, ruleset, LL_RULE_NET_PORT, &rule, 0) != 0) die("landlock_add_rule", "(tcp port)");
        }
    }
    if (syscall(LL_RESTRICT_SELF, ruleset, 0) != 0) die("landlock_restrict_self", NULL);
    close(ruleset);
}

/* ---- seccomp ----------------------------------------------------------------------------- */
/* Refused with EPERM: what a tool never needs and what only serves to reach past its sandbox
 * or the machine (debugging other processes, mounts, kernel modules and images, BPF and perf,
 * keyrings, namespaces, clocks, io_uring, whose operations seccomp cannot see). */
static const int deny[] = {
    SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_kcmp,
    438 /* pidfd_getfd */, 440 /* process_madvise */,
    SYS_mount, SYS_umount2, SYS_pivot_root, SYS_chroot,
    428 /* open_tree */, 429 /* move_mount */, 430 /* fsopen */, 431 /* fsconfig */, 432 /* fsmount */,
    433 /* fspick */, 442 /* mount_setattr */, 467 /* open_tree_attr */,
    SYS_swapon, SYS_swapoff, SYS_reboot, SYS_kexec_load, SYS_kexec_file_load,
    SYS_init_module, SYS_finit_module, SYS_delete_module,
    SYS_bpf, SYS_perf_event_open, SYS_userfaultfd,
    SYS_keyctl, SYS_add_key, SYS_request_key,
    SYS_unshare, SYS_setns,
    SYS_acct, SYS_quotactl, 443 /* quotactl_fd */, SYS_syslog, SYS_vhangup,
    SYS_settimeofday, SYS_clock_settime, SYS_clock_adjtime, SYS_sethostname, SYS_setdomainname,
    SYS_open_by_handle_at, SYS_name_to_handle_at,
    425 /* io_uring_setup */, 426 /* io_uring_enter */, 427 /* io_uring_register */,
#if defined(__x86_64__)
    SYS_iopl, SYS_ioperm, SYS_uselib, SYS_lookup_dcookie,
#endif
};

#define CLONE3 435
#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | 0x00000080 /* CLONE_NEWTIME */)
#define ARG_LO(n) (offsetof(struct seccomp_data, args) + 8 * (n)) /* little endian: the low half first */
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))
#define EPERM_ SECCOMP_RET_ERRNO | EPERM
#define TIOCSTI_ 0x5412
#define TIOCLINUX_ 0x541C
#define NETLINK_ROUTE_ 0

struct prog {
    struct sock_filter f[256];
    unsigned short n;
};

static void emit(struct prog *p, struct sock_filter insn) {
    if (p->n >= sizeof p->f / sizeof p->f[0]) {
        fprintf(stderr, "mesh-sandbox: the seccomp filter outgrew its buffer\n");
        _exit(FAIL);
    }
    p->f[p->n++] = insn;
}

/* if (A == k) return ret; */
static void if_eq_ret(struct prog *p, uint32_t k, uint32_t ret) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, k, 0, 1));
    emit(p, (struct sock_filter)RET(ret));
}

static void load(struct prog *p, uint32_t offset) {
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset));
}

static void apply_seccomp(const struct plan *pl) {
    struct prog p = {.n = 0};
    load(&p, offsetof(struct seccomp_data, arch));
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MY_AUDIT_ARCH, 1, 0));
    emit(&p, (struct sock_filter)RET(EPERM_)); /* another ABI (i386 on x86_64): nothing */
    load(&p, offsetof(struct seccomp_data, nr));
#if defined(__x86_64__)
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 0, 1)); /* x32 */
    emit(&p, (struct sock_filter)RET(EPERM_));
#endif
    for (size_t i = 0; i < sizeof deny / sizeof deny[0]; i++) if_eq_ret(&p, (uint32_t)deny[i], EPERM_);
    /* clone3 hides its flags behind a pointer: ENOSYS makes libc fall back to clone. */
    if_eq_ret(&p, CLONE3, SECCOMP_RET_ERRNO | ENOSYS);

    /* clone: no new namespace. */
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 4));
    load(&p, ARG_LO(0));
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, NS_FLAGS, 0, 1));
    emit(&p, (struct sock_filter)RET(EPERM_));
    emit(&p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));

    /* ioctl: no typing into a terminal it shares. */
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 6));
    load(&p, ARG_LO(1));
    if_eq_ret(&p, TIOCSTI_, EPERM_);
    if_eq_ret(&p, TIOCLINUX_, EPERM_);
    emit(&p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));

    /* socketpair: unix only (an event loop's wake-up, a child's pipes). */
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socketpair, 0, 4));
    load(&p, ARG_LO(0));
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 0, 1));
    emit(&p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));
    emit(&p, (struct sock_filter)RET(EPERM_));

    /* socket: no unix socket to connect to a path (Landlock does not govern connect(2) on
     * one: a root child would reach /run/systemd/private or docker.sock), no raw or packet
     * socket, netlink for routes only (getaddrinfo reads the interfaces), inet only when the
     * bundle declared network. */
    uint32_t inet_or_not = pl->inet ? SECCOMP_RET_ALLOW : EPERM_;
    unsigned short start = p.n;
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 0)); /* patched below */
    load(&p, ARG_LO(1)); /* type without SOCK_NONBLOCK / SOCK_CLOEXEC */
    emit(&p, (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xf));
    if_eq_ret(&p, SOCK_RAW, EPERM_);
    if_eq_ret(&p, SOCK_PACKET, EPERM_);
    load(&p, ARG_LO(0));
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 0, 1));
    emit(&p, (struct sock_filter)RET(inet_or_not));
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 0, 1));
    emit(&p, (struct sock_filter)RET(inet_or_not));
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_NETLINK, 0, 4));
    load(&p, ARG_LO(2));
    emit(&p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NETLINK_ROUTE_, 0, 1));
    emit(&p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));
    emit(&p, (struct sock_filter)RET(EPERM_));
    emit(&p, (struct sock_filter)RET(EPERM_)); /* every other family, unix included */
    p.f[start].jf = (unsigned char)(p.n - start - 1);
    emit(&p, (struct sock_filter)RET(SECCOMP_RET_ALLOW));

    struct sock_fprog prog = {p.n, p.f};
    /* SPEC_ALLOW: where the kernel's mitigation is "prctl and seccomp", a filter would also turn
     * on the speculative store bypass mitigation, slowing the child down; systemd's filters
     * leave it off the same way. Kernels before 4.17 do not know the flag. */
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW, &prog) != 0 &&
        (errno != EINVAL || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0))
        die("seccomp", NULL);
}

/* ---- probe ------------------------------------------------------------------------------- */
static void said(const char *name, int ok) {
    const char *why = ok ? "ok" : strerrorname_np(errno);
    printf(" %s=%s", name, why ? why : "error");
}

/* What this kernel lets this user do, tried in this process (which then exits). */
static int probe(void) {
    int abi = landlock_abi();
    int landlock_errno = errno;
    printf("landlock=%d", abi);
    errno = landlock_errno;
    if (abi == 0) said("landlock_error", 0);
    if (geteuid() == 0) {
        printf(" userns=root");
    } else {
        said("userns", map_self(1) == 0);
    }
    said("netns", new_netns(1) == 0);
    int ok = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
    if (ok) {
        struct sock_filter allow[] = {RET(SECCOMP_RET_ALLOW)};
        struct sock_fprog prog = {1, allow};
        ok = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0;
    }
    said("seccomp", ok);
    printf("\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--probe")) return probe();
    struct plan plan;
    memset(&plan, 0, sizeof plan);
    parse(&plan, argc, argv);

    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) die("prctl", "(parent-death signal)");
    if (plan.parent && getppid() != plan.parent) _exit(1); /* the node died before the signal was set */
    namespaces(&plan);
    apply_limits(&plan);
    drop_capabilities();
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("prctl", "(no_new_privs)");
    if (plan.abi > 0) apply_landlock(&plan);
    if (plan.seccomp) apply_seccomp(&plan);
    execvp(plan.argv[0], plan.argv);
    die("exec", plan.argv[0]);
    return FAIL;
}
