/*
 * codemode_host._quickjs: our binding of the QuickJS-ng engine (design.md, design 2).
 *
 * What this file owns:
 * - a pool of native worker threads that run JavaScript without the GIL;
 * - cells: one JSRuntime + JSContext each, with a heap limit, a stack limit and an interrupt
 *   flag, driven by commands (start, settle a tool call, fire a timer, wake, close);
 * - one event queue shared by all cells, signalled through an eventfd that a single trio task
 *   waits on; events are published the moment a cell's native hook makes them, so a cell that
 *   prints and then spins has its output visible while it spins.
 *
 * Rules:
 * 1. A cell runs on at most one worker at a time: a cell is in the run queue, or being run, or
 *    idle, and `scheduled` says which under `engine.lock`. Every turn starts with
 *    JS_UpdateStackTop, because the next turn may run on another worker.
 * 2. Python never runs JavaScript and workers never touch Python objects: commands carry
 *    malloc'd copies of their data in, events carry malloc'd copies out.
 * 3. `interrupt` needs neither a worker nor the GIL: it sets an atomic flag that the interrupt
 *    handler reads, and queues a wake-up so an idle cell reports the interrupt too.
 * 4. A cell reports exactly one EV_FINISHED (ok, error or interrupted), with the CPU time of
 *    all its turns; after it, commands other than close are dropped. A closed cell never
 *    reports anything.
 * 5. QuickJS cannot preempt a running turn, so a cell that computes forever holds its worker
 *    until interrupted. A monitor thread grows the pool (up to max_workers) whenever queued
 *    work has waited STARVATION_NS with every worker busy and no turn completing: spinning
 *    cells never starve the others. Queued work wakes the monitor only when it rests (nothing
 *    was stalled); one that watches a stall looks again at its deadline.
 * 6. Strings leave the engine as well-formed UTF-8: a lone surrogate becomes U+FFFD, in raw
 *    text and in JSON escapes alike (design.md, engine 1.7).
 * 7. Every turn of a running cell ends with EV_IDLE carrying how many of the commands Python
 *    submitted (start, settle, fire timer) the cell has taken so far: when that equals what
 *    Python submitted, the cell is quiescent (the pending frontier, design.md, runtime 5.9), and
 *    the CPU time the cell has used.
 * 8. Limits: each cell's heap (its own limit, and the engine-wide heap budget all cells share),
 *    its CPU time (thread CPU time of its turns, checked by the interrupt handler and at the end
 *    of each turn; past it the cell ends with OUTCOME_CPU_LIMIT) and its pending output (bytes
 *    of text and images published and not yet taken by Python: past it `text()` and `image()`
 *    throw a catchable Error, and nothing is published).
 * 9. Prepared cells: a preparer thread creates runtimes ahead of use, each with its context and
 *    the prelude read, up to `prepared_target`; `start_cell` takes one if there is one, so
 *    the runtime's creation is off the cell's critical path. The preparer runs under
 *    SCHED_IDLE: it uses only CPU nobody else wants, never delaying a worker or the host's
 *    Python (under full load the pool stays empty and cells create their runtimes, as without
 *    it). A prepared runtime
 *    belongs to the cell_t it was made for (its allocator, interrupt handler and runtime opaque
 *    point at it), so a prepared cell is a cell_t without a key yet. Preparing makes the
 *    context (disallowed globals removed) and the cell's globals' faces (prelude.js, read from
 *    its bytecode), and captures the builtins they call; nothing cell-specific happens before
 *    the runtime is taken: at the cell's start its limits are applied and its configuration
 *    defines the globals (configure_globals). A preparation that
 *    fails (the heap budget is used up) stops the refill until the next cell starts.
 * 10. Memory goes back to the system: once no cell is live and cells have freed TRIM_AFTER bytes
 *    of heap since the last time, an idle worker calls malloc_trim (glibc keeps freed memory in
 *    its arenas, one per worker thread, and a host that ran a thousand cells kept their 200 MiB
 *    after they ended). `trim()` does the same on request: the host's engine asks for it once
 *    idle, after it collected the Python garbage the cells left (`_engine.py`).
 * 11. A finished cell's runtime is freed by the worker at the end of the turn it finished in,
 *    not by a later close: closing it then needs no worker (no wake-up, no turn), and its memory
 *    goes back while the host is still handling its end. A close that frees the last live cell
 *    wakes an idle worker only if rule 10 has memory to give back.
 * 12. Every block a cell's runtime allocates is listed with the cell, and freeing the runtime
 *    frees the list instead of JS_FreeRuntime freeing object by object (nothing else holds a
 *    runtime's memory, and nothing outside it holds a pointer into it). Debug builds still
 *    call JS_FreeRuntime first, for QuickJS-ng's assertions on values the binding leaked.
 * 13. Threads are named for what they do (`codemode-worker`, `codemode-watch`,
 *    `codemode-prep`: top -H, py-spy and the benchmarks tell them apart), and the workers and
 *    the monitor run under SCHED_BATCH. A woken SCHED_BATCH thread does not preempt the thread
 *    running on its CPU; it runs once that one blocks or its slice ends. Without it, nearly
 *    every command Python queued woke a worker that took the CPU from the thread that queued
 *    it, in the middle of its work (under 64 sessions the host's trio thread, which serves
 *    every other cell, was preempted about 2,000 times a second, nine in ten times by a
 *    worker). A woken worker still gets an idle CPU at once, and its share of the CPU is the
 *    same.
 * 14. A thread that queues work signals the thread it wakes after it let go of `lock`, not
 *    while it holds it: a thread woken under the lock found it held, slept on it and had to be
 *    woken a second time. Each signalled state change is made under the lock, and each waiter
 *    checks its condition under the lock before it waits, so no wake-up is lost; a signal that
 *    comes late finds at worst a waiter with nothing to do, which waits again. (The host's
 *    trio thread made four futex wake-ups a cell of this kind before, two after.)
 * 15. The preparer is woken by the worker that ran a start, after its turn, not by the thread
 *    that started the cell: waking a sleeping thread costs its waker 8-10 us on the development
 *    VM (the futex system call that wakes it), and the caller of `start_cell` is the host's trio
 *    thread, which serves every session. Every worker checks the pool after each turn, so a
 *    long turn delays the refill only until another turn ends; a start that empties the pool
 *    wakes the preparer itself, at once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "quickjs.h"

#define MODULE_NAME "exec_main.mjs"
#define EXIT_SENTINEL "__codex_code_mode_exit__"
#define WORKER_STACK_SIZE ((size_t)64 << 20)
/* Room kept between the JS stack limit and the end of the worker's stack, for the binding's
   frames and native code that runs between two stack checks. */
#define STACK_MARGIN ((size_t)4 << 20)
#define DEFAULT_JS_STACK ((size_t)8 << 20)
#define STARVATION_NS 10000000L

/* ---------------------------------------------------------------------------------------- */
/* Commands and events                                                                      */

enum command_kind { CMD_START, CMD_SETTLE_TOOL, CMD_FIRE_TIMER, CMD_WAKE, CMD_CLOSE };

/* How CMD_SETTLE_TOOL settles its call; the prelude's dispatcher takes the same numbers. */
enum settle_kind { SETTLE_REJECT = 0, SETTLE_JSON = 1, SETTLE_TEXT = 2, SETTLE_REJECT_ERROR = 3 };

typedef struct command {
    struct command *next;
    int kind;
    int64_t id;
    int settle; /* enum settle_kind */
    char *data; /* NUL-terminated at data[len] */
    size_t len;
    char *data2;
    size_t len2;
} command_t;

enum event_kind {
    EV_STARTED = 1,
    EV_TEXT,
    EV_IMAGE,
    EV_NOTIFY,
    EV_TOOL_CALL,
    EV_STORE,
    EV_YIELD,
    EV_TIMER_SET,
    EV_TIMER_CLEAR,
    EV_FINISHED,
    EV_IDLE,
};

enum outcome { OUTCOME_OK = 0, OUTCOME_ERROR = 1, OUTCOME_INTERRUPTED = 2, OUTCOME_CPU_LIMIT = 3 };

/* EV_FINISHED's n1 carries the outcome below this bit and the cell's CPU microseconds from it. */
#define FINISHED_CPU_SHIFT 8

/* Which heap limit refused an allocation (the text of the cell's failure names it). */
enum heap_exhaustion { HEAP_FREE = 0, HEAP_CELL_LIMIT, HEAP_HOST_BUDGET };

typedef struct event {
    int64_t key;
    int kind;
    int64_t n1, n2;
    char *a;
    size_t alen;
    char *b;
    size_t blen;
} event_t;

/* A cell's finish event is allocated with the cell, so reporting the end of a cell can never
   fail for lack of memory (a cell task would otherwise wait for it forever). */
typedef struct finish_node {
    struct finish_node *next;
    event_t ev;
} finish_node_t;

/* Every block a cell's runtime allocates is its own malloc, preceded by its links in the cell's
   list of blocks, so that freeing the runtime can free them all at once (rule 12). 16 bytes,
   so blocks keep malloc's 16-byte alignment. */
typedef struct heap_block {
    struct heap_block *prev, *next;
} heap_block_t;

typedef struct engine engine_t;

/* The faces prelude.js yields, in its order. */
enum shell {
    SHELL_TEXT,
    SHELL_IMAGE,
    SHELL_GENERATED_IMAGE,
    SHELL_NOTIFY,
    SHELL_YIELD_CONTROL,
    SHELL_EXIT,
    SHELL_SET_TIMEOUT,
    SHELL_CLEAR_TIMEOUT,
    SHELL_STORE,
    SHELL_LOAD,
    SHELL_NESTED_TOOL,
    SHELL_GET_FUNCTION,
    SHELL_COUNT,
};

/* The builtins the cell's globals call, captured before cell code runs. */
enum builtin {
    BUILTIN_APPLY,
    BUILTIN_IS_ARRAY,
    BUILTIN_TRIM,
    BUILTIN_TRIM_END,
    BUILTIN_TO_LOWER_CASE,
    BUILTIN_SLICE,
    BUILTIN_ERROR,
    BUILTIN_TYPE_ERROR,
    BUILTIN_COUNT,
};

typedef struct cell {
    atomic_int refs;
    engine_t *engine;
    int64_t key;
    atomic_int interrupt;
    /* Set when one of the cell's events could not be published: the cell is stopped and
       finishes with LOST_EVENT_TEXT instead of running on with its output or calls missing. */
    atomic_int faulted;
    finish_node_t *finish_node;

    /* Guarded by engine->lock. */
    command_t *cmd_head, *cmd_tail;
    bool scheduled;
    bool close_queued;
    bool js_freed; /* the runtime is gone, freed where the cell finished (rule 11) */
    struct cell *run_next;
    struct cell *live_prev, *live_next;

    /* Owned by whichever worker runs the cell's turn. */
    JSRuntime *rt;
    JSContext *ctx;
    JSValue module_promise;
    /* The cell's globals (section "The cell's globals"): made ahead of use (rule 9). */
    JSValue shell[SHELL_COUNT]; /* prelude.js's faces */
    JSValue builtin[BUILTIN_COUNT];
    bool globals_failed; /* preparing them threw: the exception is reported by start_cell */
    JSValue stored; /* key -> JSON text (only with store_load) */
    int64_t stored_limit, stored_size;
    JSValue timers; /* id -> callback */
    int64_t timer_count, pending_timers;
    JSValue calls; /* id -> [resolve, reject] of a pending tool call */
    int64_t call_count;
    JSValue images; /* prelude_images.js's helpers, once a cell called one */
    struct cell *prepared_next;
    bool finished;
    bool exit_requested;
    int64_t commands_taken; /* start, settle and fire-timer commands run so far (rule 7) */
    heap_block_t blocks; /* the sentinel of the runtime's blocks (rule 12) */
    size_t heap_limit;
    size_t heap_used;
    size_t heap_reserved; /* of the engine's heap budget, in chunks (heap_grew) */
    bool heap_enforced;
    int heap_exhausted; /* enum heap_exhaustion */
    size_t stack_limit;
    int64_t cpu_limit_ns; /* 0: none */
    int64_t cpu_ns;       /* CPU time of the turns run so far */
    int64_t turn_start_ns;
    atomic_int cpu_exceeded;
    int64_t output_limit; /* 0: none */
    atomic_llong output_bytes;
} cell_t;

struct engine {
    pthread_mutex_t lock;
    pthread_cond_t work;
    cell_t *rq_head, *rq_tail;
    cell_t *live;
    Py_ssize_t live_count;
    bool stopping;
    bool joined;
    pthread_t *threads; /* max_workers slots */
    int nthreads;
    int max_workers;
    int idle;
    uint64_t turns_completed;
    pthread_cond_t starved;
    /* The monitor sleeps without a deadline (nothing is stalled): only then does queued work
       need to wake it (rule 5). Guarded by lock. */
    bool monitor_resting;
    pthread_t monitor;
    bool monitor_started;

    int efd;
    atomic_int signalled;
    pthread_mutex_t ev_lock;
    event_t *events;
    size_t nevents, cap_events;
    finish_node_t *finished_head, *finished_tail;
    /* Fault injection for tests: publishing fails after this many more events (-1: never). */
    int64_t fault_events_after;

    /* The heap all cells hold together, and the most they may (0: no budget). */
    atomic_size_t heap_total;
    size_t heap_budget;

    /* prelude.js (the globals' faces) compiled once per engine; each cell reads the bytecode. */
    uint8_t *prelude;
    size_t prelude_len;
    /* The class of QuickJS-ng's CallSite objects, whose getFunction each cell replaces. */
    JSClassID call_site_class;
    /* prelude_images.js, compiled likewise; read only by a cell that shows an image. */
    uint8_t *images;
    size_t images_len;

    /* Prepared cells (rule 9), guarded by lock. */
    cell_t *prepared;
    int nprepared;
    int prepared_target;
    int64_t prepared_taken; /* cells that started on a prepared runtime */
    bool prepare_failed;
    pthread_cond_t prepare_wanted;
    bool preparer_resting; /* waiting on prepare_wanted (rule 15) */
    pthread_t preparer;
    bool preparer_started;
    pthread_cond_t prepared_changed; /* for wait_prepared and wait_trimmed (tests, benchmarks) */

    /* Rule 10: heap freed since the last trim, and the trims so far (trims guarded by lock). */
    atomic_size_t freed_since_trim;
    bool trimming;
    int64_t trims;
};

static void free_command(command_t *cmd)
{
    free(cmd->data);
    free(cmd->data2);
    free(cmd);
}

static void free_commands(command_t *cmd)
{
    while (cmd) {
        command_t *next = cmd->next;
        free_command(cmd);
        cmd = next;
    }
}

static void free_event(event_t *ev)
{
    free(ev->a);
    free(ev->b);
}

static void wake_collector(engine_t *e)
{
    if (!atomic_exchange(&e->signalled, 1)) {
        uint64_t one = 1;
        ssize_t r;
        do {
            r = write(e->efd, &one, sizeof(one));
        } while (r < 0 && errno == EINTR);
    }
}

/* Appends an event and wakes the collector unless a wake-up is already pending. Takes
   ownership of a and b. Returns false, the event dropped, when there is no memory for it. */
static bool push_event(engine_t *e, int64_t key, int kind, int64_t n1, int64_t n2, char *a,
                       size_t alen, char *b, size_t blen)
{
    pthread_mutex_lock(&e->ev_lock);
    bool injected = false;
    if (e->fault_events_after >= 0) {
        injected = e->fault_events_after == 0;
        if (!injected)
            e->fault_events_after--;
    }
    if (injected || e->nevents == e->cap_events) {
        size_t cap = e->cap_events ? e->cap_events * 2 : 64;
        event_t *grown = injected ? NULL : realloc(e->events, cap * sizeof(event_t));
        if (!grown) {
            pthread_mutex_unlock(&e->ev_lock);
            free(a);
            free(b);
            return false;
        }
        e->events = grown;
        e->cap_events = cap;
    }
    e->events[e->nevents++] = (event_t){key, kind, n1, n2, a, alen, b, blen};
    pthread_mutex_unlock(&e->ev_lock);
    wake_collector(e);
    return true;
}

#define LOST_EVENT_TEXT "InternalError: the code-mode host ran out of memory for this cell's events"
#define OUTPUT_LIMIT_TEXT                                                                     \
    "exec cell output exceeds its pending output limit of %lld bytes; the output so far is "   \
    "delivered when the cell is observed"
#define CPU_LIMIT_TEXT "exec cell exceeded its CPU time limit of %lld ms"
#define CELL_HEAP_TEXT "InternalError: out of memory: exec cell exceeded its heap limit of %zu bytes"
#define BUDGET_HEAP_TEXT                                                                      \
    "InternalError: out of memory: the code-mode host's heap budget of %zu bytes is used up"

/* Publishes an event of a running cell; a cell whose event is lost is stopped (faulted). */
static void publish(cell_t *c, int kind, int64_t n1, int64_t n2, char *a, size_t alen, char *b,
                    size_t blen)
{
    if (!push_event(c->engine, c->key, kind, n1, n2, a, alen, b, blen))
        atomic_store(&c->faulted, 1);
}

/* ---------------------------------------------------------------------------------------- */
/* Text across the boundary                                                                 */

static char *dup_bytes(const char *s, size_t len)
{
    char *copy = malloc(len + 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    return copy;
}

/* QuickJS encodes a lone surrogate as the 3-byte sequence ED A0..BF xx; U+FFFD is also three
   bytes (EF BF BD), so the replacement is done in place. */
static void replace_lone_surrogates(char *s, size_t len)
{
    for (size_t i = 0; i + 2 < len; i++) {
        if ((unsigned char)s[i] == 0xED && ((unsigned char)s[i + 1] & 0xE0) == 0xA0) {
            s[i] = (char)0xEF;
            s[i + 1] = (char)0xBF;
            s[i + 2] = (char)0xBD;
            i += 2;
        }
    }
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int read_u_escape(const char *s, size_t len, size_t i)
{
    /* The value of the \uXXXX escape at s[i], or -1 if there is none. */
    if (i + 6 > len || s[i] != '\\' || s[i + 1] != 'u')
        return -1;
    int v = 0;
    for (int k = 2; k < 6; k++) {
        int h = hex_value(s[i + k]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

/* JSON.stringify escapes a lone surrogate as \udXXX, which strict JSON decoders refuse; rewrite
   each such escape (not part of a high+low pair) to \ufffd, same length, in place. */
static void replace_lone_surrogate_escapes(char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if (s[i] != '\\' || i + 1 >= len) {
            i++;
            continue;
        }
        if (s[i + 1] != 'u' || i + 6 > len) {
            i += 2;
            continue;
        }
        int v = read_u_escape(s, len, i);
        if (v >= 0xD800 && v <= 0xDBFF && i + 12 <= len) {
            int low = read_u_escape(s, len, i + 6);
            if (low >= 0xDC00 && low <= 0xDFFF) {
                i += 12;
                continue;
            }
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            memcpy(s + i + 2, "fffd", 4);
        i += 6;
    }
}

/* A malloc'd, well-formed UTF-8 copy of a JS value's string conversion, or NULL (with a JS
   exception pending) if the conversion throws. */
static char *to_utf8(JSContext *ctx, JSValueConst value, size_t *len)
{
    size_t n;
    const char *s = JS_ToCStringLen(ctx, &n, value);
    if (!s)
        return NULL;
    char *copy = dup_bytes(s, n);
    JS_FreeCString(ctx, s);
    if (!copy) {
        JS_ThrowOutOfMemory(ctx);
        return NULL;
    }
    replace_lone_surrogates(copy, n);
    *len = n;
    return copy;
}

static char *to_json_utf8(JSContext *ctx, JSValueConst value, size_t *len)
{
    char *s = to_utf8(ctx, value, len);
    if (s)
        replace_lone_surrogate_escapes(s, *len);
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* The cell's heap: our allocator enforces the limit, so we know when it was hit.          */

/* The engine-wide budget is counted in chunks each cell reserves, not per allocation: one
   atomic operation per chunk instead of one per malloc on a counter all workers share. */
#define HEAP_CHUNK ((size_t)1 << 20)
#define TRIM_AFTER ((size_t)16 << 20)

/* Whether growing the cell's heap by `grow` bytes would pass its limit or the engine's budget;
   records which one (rule 8). */
static bool heap_refuses(cell_t *c, size_t grow)
{
    if (!c->heap_enforced)
        return false;
    if (c->heap_limit && c->heap_used + grow > c->heap_limit) {
        c->heap_exhausted = HEAP_CELL_LIMIT;
        return true;
    }
    engine_t *e = c->engine;
    size_t needed = c->heap_used + grow;
    if (e->heap_budget && needed > c->heap_reserved &&
        atomic_load_explicit(&e->heap_total, memory_order_relaxed) + (needed - c->heap_reserved) >
            e->heap_budget) {
        c->heap_exhausted = HEAP_HOST_BUDGET;
        return true;
    }
    return false;
}

static void heap_grew(cell_t *c, size_t bytes)
{
    c->heap_used += bytes;
    if (c->heap_used > c->heap_reserved) {
        size_t chunk = c->heap_used - c->heap_reserved + HEAP_CHUNK;
        atomic_fetch_add_explicit(&c->engine->heap_total, chunk, memory_order_relaxed);
        c->heap_reserved += chunk;
    }
}

static void heap_shrank(cell_t *c, size_t bytes)
{
    c->heap_used -= bytes;
    if (c->heap_reserved - c->heap_used > 2 * HEAP_CHUNK) {
        size_t spare = c->heap_reserved - c->heap_used - HEAP_CHUNK;
        atomic_fetch_sub_explicit(&c->engine->heap_total, spare, memory_order_relaxed);
        c->heap_reserved -= spare;
    }
}

/* The runtime is freed: the cell gives back what it reserved of the budget. */
static void heap_release(cell_t *c)
{
    atomic_fetch_sub_explicit(&c->engine->heap_total, c->heap_reserved, memory_order_relaxed);
    c->heap_reserved = 0;
    c->heap_used = 0;
}

/* Rule 12: freeing a runtime object by object (JS_FreeRuntime walks every object the context
   made and collects their cycles) was a fifth of a trivial cell's work in the engine. The blocks
   a runtime allocates are listed instead, and freeing the runtime frees the list. QuickJS-ng
   carves its small objects out of 4 KiB slabs itself: the list holds those slabs and the
   larger blocks, not every object. */

static void heap_blocks_init(cell_t *c)
{
    c->blocks.prev = c->blocks.next = &c->blocks;
}

static void heap_blocks_free(cell_t *c)
{
    for (heap_block_t *b = c->blocks.next; b != &c->blocks;) {
        heap_block_t *next = b->next;
        free(b);
        b = next;
    }
    heap_blocks_init(c);
}

static void *block_listed(cell_t *c, heap_block_t *b)
{
    heap_grew(c, malloc_usable_size(b));
    b->prev = &c->blocks;
    b->next = c->blocks.next;
    c->blocks.next->prev = b;
    c->blocks.next = b;
    return b + 1;
}

static void *cell_calloc(void *opaque, size_t count, size_t size)
{
    cell_t *c = opaque;
    if (size && count > SIZE_MAX / size)
        return NULL;
    size_t total = count * size;
    if (total > SIZE_MAX - sizeof(heap_block_t) || heap_refuses(c, total))
        return NULL;
    heap_block_t *b = calloc(1, sizeof(heap_block_t) + total);
    return b ? block_listed(c, b) : NULL;
}

static void *cell_malloc(void *opaque, size_t size)
{
    cell_t *c = opaque;
    if (size > SIZE_MAX - sizeof(heap_block_t) || heap_refuses(c, size))
        return NULL;
    heap_block_t *b = malloc(sizeof(heap_block_t) + size);
    return b ? block_listed(c, b) : NULL;
}

static void cell_free(void *opaque, void *ptr)
{
    cell_t *c = opaque;
    if (!ptr)
        return;
    heap_block_t *b = (heap_block_t *)ptr - 1;
    b->prev->next = b->next;
    b->next->prev = b->prev;
    heap_shrank(c, malloc_usable_size(b));
    free(b);
}

static void *cell_realloc(void *opaque, void *ptr, size_t size)
{
    cell_t *c = opaque;
    if (!ptr)
        return cell_malloc(opaque, size);
    if (size == 0) {
        cell_free(opaque, ptr);
        return NULL;
    }
    heap_block_t *b = (heap_block_t *)ptr - 1;
    size_t old = malloc_usable_size(b);
    if (size > SIZE_MAX - sizeof(heap_block_t) ||
        (sizeof(heap_block_t) + size > old && heap_refuses(c, sizeof(heap_block_t) + size - old)))
        return NULL;
    heap_block_t *prev = b->prev, *next = b->next;
    heap_block_t *moved = realloc(b, sizeof(heap_block_t) + size);
    if (!moved)
        return NULL;
    prev->next = moved; /* it may have moved: its neighbours point at it again */
    next->prev = moved;
    heap_shrank(c, old);
    heap_grew(c, malloc_usable_size(moved));
    return moved + 1;
}

static size_t cell_usable_size(const void *ptr)
{
    return ptr ? malloc_usable_size((heap_block_t *)ptr - 1) - sizeof(heap_block_t) : 0;
}

static const JSMallocFunctions cell_malloc_functions = {
    cell_calloc, cell_malloc, cell_free, cell_realloc, cell_usable_size,
};

/* ---------------------------------------------------------------------------------------- */
/* Engine hooks installed in every runtime                                                  */

static int64_t thread_cpu_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

/* Whether the cell has used up its CPU time, the running turn included (rule 8). */
static bool cpu_used_up(cell_t *c)
{
    if (atomic_load_explicit(&c->cpu_exceeded, memory_order_relaxed))
        return true;
    if (!c->cpu_limit_ns || c->cpu_ns + (thread_cpu_ns() - c->turn_start_ns) <= c->cpu_limit_ns)
        return false;
    atomic_store(&c->cpu_exceeded, 1);
    return true;
}

static int interrupt_handler(JSRuntime *rt, void *opaque)
{
    cell_t *c = opaque;
    (void)rt;
    return atomic_load_explicit(&c->interrupt, memory_order_relaxed) ||
           atomic_load_explicit(&c->faulted, memory_order_relaxed) || cpu_used_up(c);
}

static char *refuse_import(JSContext *ctx, const char *base, const char *name, void *opaque)
{
    (void)base;
    (void)opaque;
    size_t n = strlen(name);
    char *message = malloc(n + 64);
    if (!message) {
        JS_ThrowOutOfMemory(ctx);
        return NULL;
    }
    int len = snprintf(message, n + 64, "Unsupported import in exec: %s", name);
    JS_Throw(ctx, JS_NewStringLen(ctx, message, (size_t)len));
    free(message);
    return NULL;
}

static JSModuleDef *never_load(JSContext *ctx, const char *name, void *opaque)
{
    (void)opaque;
    JS_ThrowInternalError(ctx, "module %s cannot be loaded", name);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Finishing a cell                                                                         */

static char *concat3(const char *a, size_t alen, const char *sep, const char *b, size_t blen,
                     size_t *len)
{
    size_t slen = strlen(sep);
    char *out = malloc(alen + slen + blen + 1);
    if (!out)
        return NULL;
    memcpy(out, a, alen);
    memcpy(out + alen, sep, slen);
    memcpy(out + alen + slen, b, blen);
    *len = alen + slen + blen;
    out[*len] = '\0';
    return out;
}

/* The text of an allocation that failed: which heap limit refused it (rule 8). */
static char *out_of_memory_text(cell_t *c, size_t *len)
{
    char text[160];
    int n;
    if (c->heap_exhausted == HEAP_HOST_BUDGET)
        n = snprintf(text, sizeof text, BUDGET_HEAP_TEXT, c->engine->heap_budget);
    else if (c->heap_exhausted == HEAP_CELL_LIMIT)
        n = snprintf(text, sizeof text, CELL_HEAP_TEXT, c->heap_limit);
    else
        n = snprintf(text, sizeof text, "InternalError: out of memory");
    *len = (size_t)n;
    return dup_bytes(text, *len);
}

/* The text of a thrown value (design.md, runtime 3.14). QuickJS stacks hold only frame lines,
   so an Error's text is built as `String(e)` + newline + stack, as V8 prints it. */
static char *error_text(JSContext *ctx, JSValueConst value, size_t *len)
{
    cell_t *c = JS_GetRuntimeOpaque(JS_GetRuntime(ctx));
    if (JS_IsNull(value) && c->heap_exhausted)
        return out_of_memory_text(c, len);
    char *head = NULL, *stack = NULL, *text = NULL;
    size_t head_len = 0, stack_len = 0;
    if (JS_IsObject(value)) {
        JSValue s = JS_GetPropertyStr(ctx, value, "stack");
        if (JS_IsString(s))
            stack = to_utf8(ctx, s, &stack_len);
        JS_FreeValue(ctx, s);
        JS_FreeValue(ctx, JS_GetException(ctx));
        while (stack_len && stack[stack_len - 1] == '\n')
            stack[--stack_len] = '\0';
    }
    if (stack && !JS_IsError(value)) {
        *len = stack_len;
        return stack;
    }
    head = to_utf8(ctx, value, &head_len);
    if (head && c->heap_exhausted && head_len == 28 &&
        memcmp(head, "InternalError: out of memory", 28) == 0) {
        free(head); /* name the limit that refused the allocation */
        head = out_of_memory_text(c, &head_len);
    }
    if (!head) {
        JS_FreeValue(ctx, JS_GetException(ctx));
        free(stack);
        if (c->heap_exhausted)
            return out_of_memory_text(c, len);
        return dup_bytes("[value that cannot be converted to a string]", *len = 44);
    }
    if (stack && stack_len) {
        text = concat3(head, head_len, "\n", stack, stack_len, len);
        free(head);
    } else {
        text = head;
        *len = head_len;
    }
    free(stack);
    return text;
}

static void finish(cell_t *c, int outcome, char *text, size_t len)
{
    engine_t *e = c->engine;
    finish_node_t *node = c->finish_node;
    c->finished = true;
    c->finish_node = NULL;
    if (!node) { /* never: a cell finishes once */
        free(text);
        return;
    }
    node->next = NULL;
    /* n1: the outcome in its low 8 bits, above them the CPU time of every turn in
       microseconds, the running one included (a cell that ends in its first turn publishes no
       EV_IDLE: its CPU time is known only here). n2: the heap the cell holds as it ends
       (telemetry: the cell span's heap attribute). */
    int64_t cpu_us = (c->cpu_ns + (thread_cpu_ns() - c->turn_start_ns)) / 1000;
    node->ev = (event_t){c->key, EV_FINISHED, (int64_t)outcome | (cpu_us << FINISHED_CPU_SHIFT),
                         (int64_t)c->heap_used, text, len, NULL, 0};
    pthread_mutex_lock(&e->ev_lock);
    if (e->finished_tail)
        e->finished_tail->next = node;
    else
        e->finished_head = node;
    e->finished_tail = node;
    pthread_mutex_unlock(&e->ev_lock);
    wake_collector(e);
}

/* Ends a cell that was asked to stop: interrupted (terminate, close), or faulted. True if it
   was. */
static bool finish_if_stopped(cell_t *c)
{
    if (atomic_load(&c->interrupt)) {
        finish(c, OUTCOME_INTERRUPTED, NULL, 0);
        return true;
    }
    if (atomic_load(&c->cpu_exceeded)) {
        char text[96];
        int n = snprintf(text, sizeof text, CPU_LIMIT_TEXT, (long long)(c->cpu_limit_ns / 1000000));
        finish(c, OUTCOME_CPU_LIMIT, dup_bytes(text, (size_t)n), (size_t)n);
        return true;
    }
    if (atomic_load(&c->faulted)) {
        finish(c, OUTCOME_ERROR, dup_bytes(LOST_EVENT_TEXT, strlen(LOST_EVENT_TEXT)),
               strlen(LOST_EVENT_TEXT));
        return true;
    }
    return false;
}

/* Reports the exception pending in the cell's context as the end of the cell. */
static void finish_with_exception(cell_t *c)
{
    JSValue exc = JS_GetException(c->ctx);
    /* Once asked to stop, the cell is interrupted, whatever the last exception was. */
    if (finish_if_stopped(c)) {
        JS_FreeValue(c->ctx, exc);
        return;
    }
    /* The limit made the cell fail; lift it so the error text can be built. */
    c->heap_enforced = false;
    size_t len = 0;
    char *text = error_text(c->ctx, exc, &len);
    JS_FreeValue(c->ctx, exc);
    finish(c, OUTCOME_ERROR, text, len);
}

static bool is_exit_sentinel(JSContext *ctx, JSValueConst value)
{
    if (!JS_IsString(value))
        return false;
    size_t n;
    const char *s = JS_ToCStringLen(ctx, &n, value);
    bool same = s && n == strlen(EXIT_SENTINEL) && memcmp(s, EXIT_SENTINEL, n) == 0;
    JS_FreeCString(ctx, s);
    return same;
}

/* Runs queued promise jobs, then reports the cell finished if its module promise settled. */
static void settle(cell_t *c)
{
    for (;;) {
        JSContext *job_ctx;
        int r = JS_ExecutePendingJob(c->rt, &job_ctx);
        if (r == 0)
            break;
        if (r < 0) {
            finish_with_exception(c);
            return;
        }
    }
    if (finish_if_stopped(c))
        return;
    JSPromiseStateEnum state = JS_PromiseState(c->ctx, c->module_promise);
    if (state == JS_PROMISE_FULFILLED) {
        finish(c, OUTCOME_OK, NULL, 0);
    } else if (state == JS_PROMISE_REJECTED) {
        JSValue reason = JS_PromiseResult(c->ctx, c->module_promise);
        if (c->exit_requested && is_exit_sentinel(c->ctx, reason)) {
            finish(c, OUTCOME_OK, NULL, 0);
        } else {
            c->heap_enforced = false;
            size_t len = 0;
            char *text = error_text(c->ctx, reason, &len);
            finish(c, OUTCOME_ERROR, text, len);
        }
        JS_FreeValue(c->ctx, reason);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* The cell's globals                                                                       */

/* A cell's globals are the faces prelude.js yields (JavaScript, for the sandbox surface they
   show) over the native work below: what they convert, check, publish and keep. The faces
   call one native hook with the number of what they do (`enum hook`). Their state (stored
   values, timers, pending tool calls) lives in the cell's runtime, held by its cell_t: cell
   code can neither reach nor replace it. All of this was prelude.js's own JavaScript, which
   each cell read and ran (a fifth of a trivial cell's instructions in the engine). Its rules
   hold:
   1. The builtins used here are the engine's own C functions, or captured before cell code
      ran (`enum builtin`), never looked up again in the cell's globals.
   2. Validation errors are thrown as plain strings with the reference's exact texts
      (design.md, runtime 3.3).
   3. Values leave as JSON text and come back through JSON parsing: every load and every tool
      result is a fresh copy. A tool result that is a string comes as its text, parsing nothing
      (a string has no identity to share, and a large one was most of a tool call's cost). */

enum hook {
    HOOK_TEXT,
    HOOK_IMAGE,
    HOOK_GENERATED_IMAGE,
    HOOK_NOTIFY,
    HOOK_YIELD,
    HOOK_EXIT,
    HOOK_TIMER_SET,
    HOOK_TIMER_CLEAR,
    HOOK_STORE,
    HOOK_LOAD,
    HOOK_TOOL_CALL,
};

/* The functions of prelude_images.js's kit that are ours (the others are captured builtins). */
enum kit_function { KIT_STRINGIFY, KIT_PARSE_JSON, KIT_DEBUG_QUOTE, KIT_IMAGE, KIT_TEXT };

/* Each pending timer is a task on the host: a cell may not hold an unbounded number of them. */
#define MAX_PENDING_TIMERS 10000
#define UNCONVERTIBLE_TEXT "[value that cannot be converted to a string]"

/* Bytes an output item counts for, as the runtime counts them (`_observer.item_bytes`). */
#define OUTPUT_ITEM_OVERHEAD 64

/* Reserves room for an item of `len` bytes under the pending output limit (rule 8). */
static bool take_output_room(cell_t *c, size_t len)
{
    long long item = (long long)len + OUTPUT_ITEM_OVERHEAD;
    long long now = atomic_fetch_add(&c->output_bytes, item);
    if (c->output_limit && now + item > c->output_limit) {
        atomic_fetch_sub(&c->output_bytes, item);
        return false;
    }
    return true;
}

static JSValue throw_output_limit(JSContext *ctx, cell_t *c)
{
    return JS_ThrowPlainError(ctx, OUTPUT_LIMIT_TEXT, (long long)c->output_limit);
}

/* Runs one of the engine's compiled prelude scripts (compile_prelude) in `ctx`: the value it
   yields, a function. */
static JSValue run_prelude_script(JSContext *ctx, const uint8_t *bytecode, size_t len)
{
    JSValue fn = JS_ReadObject(ctx, bytecode, len, JS_READ_OBJ_BYTECODE);
    return JS_IsException(fn) ? fn : JS_EvalFunction(ctx, fn);
}

/* Throws a string value (rule 2); takes ownership of `text`, which may be an exception. */
static JSValue throw_string(JSContext *ctx, JSValue text)
{
    return JS_IsException(text) ? text : JS_Throw(ctx, text);
}

static JSValue throw_text(JSContext *ctx, const char *text)
{
    return throw_string(ctx, JS_NewString(ctx, text));
}

/* The texts of `a`, `v` and `b` joined (on error paths only: it converts through UTF-8). */
static JSValue join_text(JSContext *ctx, const char *a, JSValueConst v, const char *b)
{
    size_t vlen;
    const char *vs = JS_ToCStringLen(ctx, &vlen, v);
    if (!vs)
        return JS_EXCEPTION;
    size_t alen = strlen(a), blen = strlen(b);
    char *out = malloc(alen + vlen + blen + 1);
    JSValue s;
    if (out) {
        memcpy(out, a, alen);
        memcpy(out + alen, vs, vlen);
        memcpy(out + alen + vlen, b, blen);
        s = JS_NewStringLen(ctx, out, alen + vlen + blen);
        free(out);
    } else {
        s = JS_ThrowOutOfMemory(ctx);
    }
    JS_FreeCString(ctx, vs);
    return s;
}

/* `head` + newline + `frames`, or `head` alone when `frames` is empty; takes ownership of
   both strings (either may be an exception). */
static JSValue with_frames(JSContext *ctx, JSValue head, JSValue frames)
{
    int64_t n = 0;
    JSValue text = head;
    if (JS_IsException(frames)) {
        JS_FreeValue(ctx, head);
        return frames;
    }
    if (!JS_IsException(head) && JS_GetLength(ctx, frames, &n) == 0 && n > 0) {
        JSValue line = join_text(ctx, "", head, "\n");
        const char *l = JS_IsException(line) ? NULL : JS_ToCString(ctx, line);
        text = l ? join_text(ctx, l, frames, "") : JS_EXCEPTION;
        JS_FreeCString(ctx, l);
        JS_FreeValue(ctx, line);
        JS_FreeValue(ctx, head);
    }
    JS_FreeValue(ctx, frames);
    return text;
}

/* `${value}`, else String(value) (the cell's own String, as the prelude called it), else a
   placeholder: the text of any value, never throwing (but for lack of memory). */
static JSValue safe_string(JSContext *ctx, JSValueConst value)
{
    JSValue s = JS_ToString(ctx, value);
    if (!JS_IsException(s))
        return s;
    JS_FreeValue(ctx, JS_GetException(ctx));
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue ctor = JS_GetPropertyStr(ctx, global, "String");
    JS_FreeValue(ctx, global);
    s = JS_IsException(ctor) ? ctor : JS_Call(ctx, ctor, JS_UNDEFINED, 1, &value);
    JS_FreeValue(ctx, ctor);
    if (!JS_IsException(s))
        return s;
    JS_FreeValue(ctx, JS_GetException(ctx));
    return JS_NewString(ctx, UNCONVERTIBLE_TEXT);
}

/* The text of a thrown value, as the reference builds it (design.md, runtime 3.14). QuickJS
   stacks hold only the frame lines, so an Error's text is `String(e)` followed by its frames,
   as in V8; another object with a string stack gives that stack. */
static JSValue thrown_text(cell_t *c, JSValueConst thrown)
{
    JSContext *ctx = c->ctx;
    if (!JS_IsObject(thrown))
        return safe_string(ctx, thrown);
    JSValue stack = JS_GetPropertyStr(ctx, thrown, "stack");
    if (JS_IsException(stack)) {
        JS_FreeValue(ctx, JS_GetException(ctx));
        stack = JS_UNDEFINED;
    }
    if (!JS_IsString(stack)) {
        JS_FreeValue(ctx, stack);
        return safe_string(ctx, thrown);
    }
    int is_error = JS_IsInstanceOf(ctx, thrown, c->builtin[BUILTIN_ERROR]);
    if (is_error <= 0) {
        if (is_error == 0)
            return stack;
        JS_FreeValue(ctx, stack);
        return JS_EXCEPTION;
    }
    JSValue frames = JS_Call(ctx, c->builtin[BUILTIN_TRIM_END], stack, 0, NULL);
    JS_FreeValue(ctx, stack);
    if (JS_IsException(frames))
        return frames;
    return with_frames(ctx, safe_string(ctx, thrown), frames);
}

/* JSON.stringify(value), which throws its failure as a plain string: a string, or undefined
   for a value JSON has no text for. QuickJS reports a cycle as "circular reference"; the
   reference's text (and its tests) use V8's wording. */
static JSValue json_text(cell_t *c, JSValueConst value)
{
    JSContext *ctx = c->ctx;
    JSValue json = JS_JSONStringify(ctx, value, JS_UNDEFINED, JS_UNDEFINED);
    if (!JS_IsException(json))
        return json;
    JSValue error = JS_GetException(ctx);
    JSValue text;
    int is_type_error = JS_IsInstanceOf(ctx, error, c->builtin[BUILTIN_TYPE_ERROR]);
    if (is_type_error < 0) {
        text = JS_EXCEPTION;
    } else {
        bool circular = false;
        if (is_type_error) {
            JSValue message = JS_GetPropertyStr(ctx, error, "message");
            if (JS_IsException(message)) {
                JS_FreeValue(ctx, error);
                return message;
            }
            const char *m = JS_IsString(message) ? JS_ToCString(ctx, message) : NULL;
            circular = m && strcmp(m, "circular reference") == 0;
            JS_FreeCString(ctx, m);
            JS_FreeValue(ctx, message);
        }
        if (circular) {
            JSValue stack = JS_GetPropertyStr(ctx, error, "stack");
            JSValue frames = JS_IsException(stack) ? stack : JS_NewString(ctx, "");
            if (JS_IsString(stack)) {
                JS_FreeValue(ctx, frames);
                frames = JS_Call(ctx, c->builtin[BUILTIN_TRIM_END], stack, 0, NULL);
            }
            JS_FreeValue(ctx, stack);
            text = with_frames(
                ctx, JS_NewString(ctx, "TypeError: Converting circular structure to JSON"), frames);
        } else {
            text = thrown_text(c, error);
        }
    }
    JS_FreeValue(ctx, error);
    return throw_string(ctx, text);
}

/* Section 3.4: how text() and notify() turn a value into text. */
static JSValue output_text(cell_t *c, JSValueConst value)
{
    JSContext *ctx = c->ctx;
    if (JS_IsString(value)) /* a flat string or a rope (a long concatenation) */
        return JS_DupValue(ctx, value);
    switch (JS_VALUE_GET_NORM_TAG(value)) {
    case JS_TAG_UNDEFINED:
        return JS_NewString(ctx, "undefined");
    case JS_TAG_INT:
    case JS_TAG_FLOAT64:
    case JS_TAG_BIG_INT:
    case JS_TAG_SHORT_BIG_INT:
        return safe_string(ctx, value);
    case JS_TAG_BOOL:
        return JS_NewString(ctx, JS_VALUE_GET_BOOL(value) ? "true" : "false");
    case JS_TAG_NULL:
        return JS_NewString(ctx, "null");
    }
    JSValue json = json_text(c, value);
    if (JS_IsException(json) || JS_IsString(json))
        return json;
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue ctor = JS_GetPropertyStr(ctx, global, "String");
    JS_FreeValue(ctx, global);
    JSValue s = JS_IsException(ctor) ? ctor : JS_Call(ctx, ctor, JS_UNDEFINED, 1, &value);
    JS_FreeValue(ctx, ctor);
    if (!JS_IsException(s))
        return s;
    JSValue error = JS_GetException(ctx);
    JSValue text = thrown_text(c, error);
    JS_FreeValue(ctx, error);
    return throw_string(ctx, text);
}

/* A key as Rust's `{:?}` prints a string: the reference quotes store keys that way. */
static JSValue debug_quote(JSContext *ctx, JSValueConst key)
{
    size_t n;
    const char *s = JS_ToCStringLen(ctx, &n, key);
    if (!s)
        return JS_EXCEPTION;
    char *out = malloc(n * 8 + 3); /* \u{7f} is the longest escape, of one byte */
    if (!out) {
        JS_FreeCString(ctx, s);
        return JS_ThrowOutOfMemory(ctx);
    }
    size_t k = 0;
    out[k++] = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            out[k++] = '\\';
            out[k++] = (char)ch;
        } else if (ch == '\n') {
            memcpy(out + k, "\\n", 2), k += 2;
        } else if (ch == '\r') {
            memcpy(out + k, "\\r", 2), k += 2;
        } else if (ch == '\t') {
            memcpy(out + k, "\\t", 2), k += 2;
        } else if (ch == 0) {
            memcpy(out + k, "\\0", 2), k += 2;
        } else if (ch < 0x20 || ch == 0x7f) {
            k += (size_t)sprintf(out + k, "\\u{%x}", ch);
        } else {
            out[k++] = (char)ch;
        }
    }
    out[k++] = '"';
    JSValue quoted = JS_NewStringLen(ctx, out, k);
    free(out);
    JS_FreeCString(ctx, s);
    return quoted;
}

/* `${key}`, or the helper's error text if that throws. */
static JSValue key_text(JSContext *ctx, JSValueConst key, const char *helper)
{
    JSValue name = JS_ToString(ctx, key);
    if (!JS_IsException(name))
        return name;
    JS_FreeValue(ctx, JS_GetException(ctx));
    char text[64];
    snprintf(text, sizeof text, "%s key must be a string", helper);
    return throw_text(ctx, text);
}

/* A string's length in UTF-16 code units, the unit of the stored values' limit. */
static int64_t text_length(JSContext *ctx, JSValueConst s)
{
    int64_t n = 0;
    JS_GetLength(ctx, s, &n);
    return n;
}

/* The own value of `obj[key]`, or undefined (JS_UNDEFINED also when absent). */
static JSValue own_value(JSContext *ctx, JSValueConst obj, JSAtom key, bool *found)
{
    JSPropertyDescriptor desc;
    int r = JS_GetOwnProperty(ctx, &desc, obj, key);
    *found = r > 0;
    if (r <= 0)
        return r < 0 ? JS_EXCEPTION : JS_UNDEFINED;
    JS_FreeValue(ctx, desc.getter);
    JS_FreeValue(ctx, desc.setter);
    return desc.value;
}

/* A null-prototype object held by the cell (its stored values, timers, calls), made on first
   use; false with an exception pending if memory ran out. */
static bool held_table(JSContext *ctx, JSValue *table)
{
    if (JS_IsUndefined(*table))
        *table = JS_NewObjectProto(ctx, JS_NULL);
    return !JS_IsException(*table);
}

static JSValue store_value(cell_t *c, JSValueConst key, JSValueConst value)
{
    JSContext *ctx = c->ctx;
    JSValue name = key_text(ctx, key, "store");
    if (JS_IsException(name))
        return name;
    JSValue json = json_text(c, value);
    JSValue result = JS_EXCEPTION;
    JSAtom atom = JS_ATOM_NULL;
    if (JS_IsException(json))
        goto done;
    if (!JS_IsString(json)) {
        JSValue quoted = debug_quote(ctx, name);
        if (!JS_IsException(quoted))
            throw_string(ctx, join_text(ctx, "Unable to store ", quoted,
                                        ". Only plain serializable objects can be stored."));
        JS_FreeValue(ctx, quoted);
        goto done;
    }
    if (!held_table(ctx, &c->stored) || (atom = JS_ValueToAtom(ctx, name)) == JS_ATOM_NULL)
        goto done;
    bool found;
    JSValue previous_json = own_value(ctx, c->stored, atom, &found);
    if (JS_IsException(previous_json))
        goto done;
    int64_t name_len = text_length(ctx, name);
    int64_t previous = found ? name_len + text_length(ctx, previous_json) : 0;
    JS_FreeValue(ctx, previous_json);
    int64_t size = c->stored_size - previous + name_len + text_length(ctx, json);
    if (c->stored_limit && size > c->stored_limit) {
        JSValue quoted = debug_quote(ctx, name);
        if (!JS_IsException(quoted)) {
            char limit[96];
            snprintf(limit, sizeof limit,
                     ". The session's stored values would exceed their limit of %lld bytes.",
                     (long long)c->stored_limit);
            throw_string(ctx, join_text(ctx, "Unable to store ", quoted, limit));
        }
        JS_FreeValue(ctx, quoted);
        goto done;
    }
    if (JS_DefinePropertyValue(ctx, c->stored, atom, JS_DupValue(ctx, json), JS_PROP_C_W_E) < 0)
        goto done;
    c->stored_size = size;
    size_t alen, blen;
    char *a = to_utf8(ctx, name, &alen);
    char *b = a ? to_json_utf8(ctx, json, &blen) : NULL;
    if (!b) {
        free(a);
        goto done;
    }
    publish(c, EV_STORE, 0, 0, a, alen, b, blen);
    result = JS_UNDEFINED;
done:
    if (atom != JS_ATOM_NULL)
        JS_FreeAtom(ctx, atom);
    JS_FreeValue(ctx, json);
    JS_FreeValue(ctx, name);
    return result;
}

static JSValue load_value(cell_t *c, JSValueConst key)
{
    JSContext *ctx = c->ctx;
    JSValue name = key_text(ctx, key, "load");
    if (JS_IsException(name))
        return name;
    if (JS_IsUndefined(c->stored)) {
        JS_FreeValue(ctx, name);
        return JS_UNDEFINED;
    }
    JSAtom atom = JS_ValueToAtom(ctx, name);
    JS_FreeValue(ctx, name);
    if (atom == JS_ATOM_NULL)
        return JS_EXCEPTION;
    bool found;
    JSValue json = own_value(ctx, c->stored, atom, &found);
    JS_FreeAtom(ctx, atom);
    if (JS_IsException(json) || !found)
        return json;
    size_t n;
    const char *s = JS_ToCStringLen(ctx, &n, json);
    JS_FreeValue(ctx, json);
    JSValue value = s ? JS_ParseJSON(ctx, s, n, "<input>") : JS_EXCEPTION;
    JS_FreeCString(ctx, s);
    if (!JS_IsException(value))
        return value;
    JS_FreeValue(ctx, JS_GetException(ctx));
    return throw_text(ctx, "failed to load stored value");
}

static JSValue set_timeout(cell_t *c, JSValueConst callback, JSValueConst delay_ms)
{
    JSContext *ctx = c->ctx;
    if (!JS_IsFunction(ctx, callback))
        return throw_text(ctx, "setTimeout expects a function callback");
    double delay;
    if (JS_ToFloat64(ctx, &delay, delay_ms))
        return JS_EXCEPTION;
    delay = !isfinite(delay) || delay <= 0 ? 0 : trunc(delay);
    if (c->pending_timers >= MAX_PENDING_TIMERS) {
        char text[96];
        snprintf(text, sizeof text, "setTimeout: too many pending timers (the limit is %d)",
                 MAX_PENDING_TIMERS);
        return throw_text(ctx, text);
    }
    if (!held_table(ctx, &c->timers))
        return JS_EXCEPTION;
    int64_t id = c->timer_count + 1;
    if (JS_SetPropertyInt64(ctx, c->timers, id, JS_DupValue(ctx, callback)) < 0)
        return JS_EXCEPTION;
    c->timer_count = id;
    c->pending_timers++;
    int64_t n2 = 0;
    JSValue d = JS_NewFloat64(ctx, delay);
    JS_ToInt64(ctx, &n2, d);
    publish(c, EV_TIMER_SET, id, n2, NULL, 0, NULL, 0);
    return JS_NewInt64(ctx, id);
}

static JSValue clear_timeout(cell_t *c, JSValueConst id)
{
    JSContext *ctx = c->ctx;
    if (JS_IsUndefined(id) || JS_IsNull(id))
        return JS_UNDEFINED;
    double number;
    if (JS_ToFloat64(ctx, &number, id)) {
        JS_FreeValue(ctx, JS_GetException(ctx));
        return throw_text(ctx, "clearTimeout expects a numeric timeout id");
    }
    if (!isfinite(number) || number <= 0)
        return JS_UNDEFINED;
    number = trunc(number);
    /* Ids run from 1 to timer_count: nothing else was ever set. */
    if (JS_IsUndefined(c->timers) || number > (double)c->timer_count || number > UINT32_MAX)
        return JS_UNDEFINED;
    JSAtom atom = JS_NewAtomUInt32(ctx, (uint32_t)number);
    if (atom == JS_ATOM_NULL)
        return JS_EXCEPTION;
    int has = JS_HasProperty(ctx, c->timers, atom);
    if (has > 0 && JS_DeleteProperty(ctx, c->timers, atom, 0) >= 0) {
        c->pending_timers--;
        publish(c, EV_TIMER_CLEAR, (int64_t)number, 0, NULL, 0, NULL, 0);
    }
    JS_FreeAtom(ctx, atom);
    return has < 0 ? JS_EXCEPTION : JS_UNDEFINED;
}

/* A call of `tools.<name>`: its input's JSON text goes to the host, and the promise returned
   is settled by settle_tool_call. */
static JSValue call_tool(cell_t *c, JSValueConst index, JSValueConst args)
{
    JSContext *ctx = c->ctx;
    int64_t count = 0, tool = 0;
    if (JS_GetLength(ctx, args, &count) < 0 || JS_ToInt64(ctx, &tool, index))
        return JS_EXCEPTION;
    JSValue input = JS_UNDEFINED;
    if (count > 0) {
        JSValue first = JS_GetPropertyUint32(ctx, args, 0);
        if (JS_IsException(first))
            return first;
        input = json_text(c, first);
        JS_FreeValue(ctx, first);
        if (JS_IsException(input))
            return input;
    }
    char *a = NULL;
    size_t alen = 0;
    if (!JS_IsUndefined(input) && !(a = to_json_utf8(ctx, input, &alen))) {
        JS_FreeValue(ctx, input);
        return JS_EXCEPTION;
    }
    JS_FreeValue(ctx, input);
    JSValue settle[2];
    JSValue promise = JS_NewPromiseCapability(ctx, settle);
    if (JS_IsException(promise) || !held_table(ctx, &c->calls)) {
        free(a);
        if (!JS_IsException(promise)) {
            JS_FreeValue(ctx, settle[0]);
            JS_FreeValue(ctx, settle[1]);
        }
        JS_FreeValue(ctx, promise);
        return JS_EXCEPTION;
    }
    int64_t id = c->call_count + 1;
    if (JS_SetPropertyInt64(ctx, c->calls, id, JS_NewArrayFrom(ctx, 2, settle)) < 0) {
        free(a);
        JS_FreeValue(ctx, promise);
        return JS_EXCEPTION;
    }
    c->call_count = id;
    publish(c, EV_TOOL_CALL, id, tool, a, alen, NULL, 0);
    return promise;
}

/* prelude_images.js's {image, generatedImage}, read on a cell's first call of one. */
static JSValue image_helpers(cell_t *c);

/* The hook every face of prelude.js calls: hook(what, ...arguments). */
static JSValue cell_hook(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv)
{
    (void)this_val;
    cell_t *c = JS_GetRuntimeOpaque(JS_GetRuntime(ctx));
    JSValueConst arg[4];
    for (int i = 0; i < 4; i++)
        arg[i] = i + 1 < argc ? argv[i + 1] : JS_UNDEFINED;
    int32_t what = -1;
    if (argc > 0)
        JS_ToInt32(ctx, &what, argv[0]);
    char *a = NULL;
    size_t alen = 0;

    switch (what) {
    case HOOK_TEXT:
        if (!(a = to_utf8(ctx, arg[0], &alen)))
            return JS_EXCEPTION;
        if (!take_output_room(c, alen)) {
            free(a);
            return throw_output_limit(ctx, c);
        }
        publish(c, EV_TEXT, 0, 0, a, alen, NULL, 0);
        return JS_UNDEFINED;
    case HOOK_NOTIFY: {
        JSValue message = output_text(c, arg[0]);
        if (JS_IsException(message))
            return message;
        JSValue trimmed = JS_Call(ctx, c->builtin[BUILTIN_TRIM], message, 0, NULL);
        int64_t n = 1;
        if (JS_IsException(trimmed) || JS_GetLength(ctx, trimmed, &n) < 0) {
            JS_FreeValue(ctx, message);
            return JS_EXCEPTION;
        }
        JS_FreeValue(ctx, trimmed);
        a = n == 0 ? NULL : to_utf8(ctx, message, &alen);
        JS_FreeValue(ctx, message);
        if (n == 0)
            return throw_text(ctx, "notify expects non-empty text");
        if (!a)
            return JS_EXCEPTION;
        publish(c, EV_NOTIFY, 0, 0, a, alen, NULL, 0);
        return JS_UNDEFINED;
    }
    case HOOK_IMAGE:
    case HOOK_GENERATED_IMAGE: {
        JSValue helpers = image_helpers(c);
        if (JS_IsException(helpers))
            return helpers;
        bool image = what == HOOK_IMAGE;
        JSValue fn = JS_GetPropertyStr(ctx, helpers, image ? "image" : "generatedImage");
        JS_FreeValue(ctx, helpers);
        if (JS_IsException(fn))
            return fn;
        JSValue r = JS_Call(ctx, fn, JS_UNDEFINED, image ? 3 : 1, arg);
        JS_FreeValue(ctx, fn);
        return r;
    }
    case HOOK_YIELD:
        publish(c, EV_YIELD, 0, 0, NULL, 0, NULL, 0);
        return JS_UNDEFINED;
    case HOOK_EXIT:
        c->exit_requested = true;
        return throw_text(ctx, EXIT_SENTINEL);
    case HOOK_TIMER_SET:
        return set_timeout(c, arg[0], arg[1]);
    case HOOK_TIMER_CLEAR:
        return clear_timeout(c, arg[0]);
    case HOOK_STORE:
        return store_value(c, arg[0], arg[1]);
    case HOOK_LOAD:
        return load_value(c, arg[0]);
    case HOOK_TOOL_CALL:
        return call_tool(c, arg[0], arg[1]);
    }
    return JS_UNDEFINED;
}

/* `outputText` of prelude.js: a native function of that name (prelude.js, rule 2). */
static JSValue cell_output_text(JSContext *ctx, JSValueConst this_val, int argc,
                                JSValueConst *argv)
{
    (void)this_val;
    cell_t *c = JS_GetRuntimeOpaque(JS_GetRuntime(ctx));
    return output_text(c, argc > 0 ? argv[0] : JS_UNDEFINED);
}

/* The kit's own functions (prelude_images.js reads them from its kit). */
static JSValue kit_function(JSContext *ctx, JSValueConst this_val, int argc, JSValueConst *argv,
                            int magic)
{
    (void)this_val;
    cell_t *c = JS_GetRuntimeOpaque(JS_GetRuntime(ctx));
    JSValueConst arg0 = argc > 0 ? argv[0] : JS_UNDEFINED;
    JSValueConst arg1 = argc > 1 ? argv[1] : JS_UNDEFINED;
    char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    switch (magic) {
    case KIT_STRINGIFY:
        return JS_JSONStringify(ctx, arg0, JS_UNDEFINED, JS_UNDEFINED);
    case KIT_PARSE_JSON: {
        size_t n;
        const char *s = JS_ToCStringLen(ctx, &n, arg0);
        if (!s)
            return JS_EXCEPTION;
        JSValue value = JS_ParseJSON(ctx, s, n, "<input>");
        JS_FreeCString(ctx, s);
        return value;
    }
    case KIT_DEBUG_QUOTE:
        return debug_quote(ctx, arg0);
    case KIT_IMAGE:
        if (!(a = to_utf8(ctx, arg0, &alen)))
            return JS_EXCEPTION;
        if (!(b = to_utf8(ctx, arg1, &blen))) {
            free(a);
            return JS_EXCEPTION;
        }
        if (!take_output_room(c, alen)) {
            free(a);
            free(b);
            return throw_output_limit(ctx, c);
        }
        publish(c, EV_IMAGE, 0, 0, a, alen, b, blen);
        return JS_UNDEFINED;
    case KIT_TEXT:
        if (!(a = to_utf8(ctx, arg0, &alen)))
            return JS_EXCEPTION;
        if (!take_output_room(c, alen)) {
            free(a);
            return throw_output_limit(ctx, c);
        }
        publish(c, EV_TEXT, 0, 0, a, alen, NULL, 0);
        return JS_UNDEFINED;
    }
    return JS_UNDEFINED;
}

/* Defines `name` on obj as a kit function (or a captured builtin when fn is given). */
static bool kit_entry(JSContext *ctx, JSValueConst obj, const char *name, int magic, int length,
                      JSValueConst builtin)
{
    JSValue fn = JS_IsUndefined(builtin)
                     ? JS_NewCFunctionMagic(ctx, kit_function, name, length,
                                            JS_CFUNC_generic_magic, magic)
                     : JS_DupValue(ctx, builtin);
    return !JS_IsException(fn) && JS_DefinePropertyValueStr(ctx, obj, name, fn, JS_PROP_C_W_E) >= 0;
}

static JSValue image_helpers(cell_t *c)
{
    JSContext *ctx = c->ctx;
    if (!JS_IsUndefined(c->images))
        return JS_DupValue(ctx, c->images);
    /* The kit prelude_images.js takes: builtins as they were before cell code ran. */
    JSValue kit = JS_NewObjectProto(ctx, JS_NULL);
    JSValue native = JS_NewObjectProto(ctx, JS_NULL);
    bool ok = !JS_IsException(kit) && !JS_IsException(native) &&
              kit_entry(ctx, kit, "apply", 0, 0, c->builtin[BUILTIN_APPLY]) &&
              kit_entry(ctx, kit, "stringify", KIT_STRINGIFY, 1, JS_UNDEFINED) &&
              kit_entry(ctx, kit, "parseJson", KIT_PARSE_JSON, 1, JS_UNDEFINED) &&
              kit_entry(ctx, kit, "isArray", 0, 0, c->builtin[BUILTIN_IS_ARRAY]) &&
              kit_entry(ctx, kit, "toLowerCase", 0, 0, c->builtin[BUILTIN_TO_LOWER_CASE]) &&
              kit_entry(ctx, kit, "sliceString", 0, 0, c->builtin[BUILTIN_SLICE]) &&
              kit_entry(ctx, kit, "debugQuote", KIT_DEBUG_QUOTE, 1, JS_UNDEFINED) &&
              kit_entry(ctx, native, "image", KIT_IMAGE, 2, JS_UNDEFINED) &&
              kit_entry(ctx, native, "text", KIT_TEXT, 1, JS_UNDEFINED) &&
              JS_DefinePropertyValueStr(ctx, kit, "native", JS_DupValue(ctx, native),
                                        JS_PROP_C_W_E) >= 0;
    JS_FreeValue(ctx, native);
    if (!ok) {
        JS_FreeValue(ctx, kit);
        return JS_EXCEPTION;
    }
    JSValue make = run_prelude_script(ctx, c->engine->images, c->engine->images_len);
    JSValue helpers = JS_IsException(make) ? make : JS_Call(ctx, make, JS_UNDEFINED, 1, &kit);
    JS_FreeValue(ctx, make);
    JS_FreeValue(ctx, kit);
    if (JS_IsException(helpers))
        return helpers;
    c->images = helpers;
    return JS_DupValue(ctx, helpers);
}

/* Captures the builtins this code calls (rule 1), before any cell code runs. */
static bool capture_builtins(cell_t *c)
{
    JSContext *ctx = c->ctx;
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue reflect = JS_GetPropertyStr(ctx, global, "Reflect");
    JSValue array = JS_GetPropertyStr(ctx, global, "Array");
    JSValue string = JS_NewString(ctx, ""); /* a string primitive reads String.prototype's */
    c->builtin[BUILTIN_APPLY] = JS_GetPropertyStr(ctx, reflect, "apply");
    c->builtin[BUILTIN_IS_ARRAY] = JS_GetPropertyStr(ctx, array, "isArray");
    c->builtin[BUILTIN_TRIM] = JS_GetPropertyStr(ctx, string, "trim");
    c->builtin[BUILTIN_TRIM_END] = JS_GetPropertyStr(ctx, string, "trimEnd");
    c->builtin[BUILTIN_TO_LOWER_CASE] = JS_GetPropertyStr(ctx, string, "toLowerCase");
    c->builtin[BUILTIN_SLICE] = JS_GetPropertyStr(ctx, string, "slice");
    c->builtin[BUILTIN_ERROR] = JS_GetPropertyStr(ctx, global, "Error");
    c->builtin[BUILTIN_TYPE_ERROR] = JS_GetPropertyStr(ctx, global, "TypeError");
    JS_FreeValue(ctx, string);
    JS_FreeValue(ctx, array);
    JS_FreeValue(ctx, reflect);
    JS_FreeValue(ctx, global);
    for (int i = 0; i < BUILTIN_COUNT; i++)
        if (JS_IsException(c->builtin[i]))
            return false;
    return true;
}

/* Preparing a runtime (rule 9): prelude.js's faces made, CallSite's getFunction replaced, the
   builtins captured (rule 1). False with an exception pending if it failed. */
static bool prepare_globals(cell_t *c)
{
    JSContext *ctx = c->ctx;
    engine_t *e = c->engine;
    JSValue prepare = run_prelude_script(ctx, e->prelude, e->prelude_len);
    if (JS_IsException(prepare))
        return false;
    JSValue natives[2] = {
        JS_NewCFunction(ctx, cell_hook, "native", 5),
        JS_NewCFunction(ctx, cell_output_text, "outputText", 1),
    };
    JSValue shells = JS_IsException(natives[0]) || JS_IsException(natives[1])
                         ? JS_EXCEPTION
                         : JS_Call(ctx, prepare, JS_UNDEFINED, 2, (JSValueConst *)natives);
    JS_FreeValue(ctx, natives[0]);
    JS_FreeValue(ctx, natives[1]);
    JS_FreeValue(ctx, prepare);
    if (JS_IsException(shells))
        return false;
    bool ok = true;
    for (uint32_t i = 0; i < SHELL_COUNT && ok; i++) {
        c->shell[i] = JS_GetPropertyUint32(ctx, shells, i);
        ok = JS_IsFunction(ctx, c->shell[i]);
    }
    JS_FreeValue(ctx, shells);
    if (!ok) {
        JS_ThrowInternalError(ctx, "prelude.js yields too few functions");
        return false;
    }
    JSValue call_site = JS_GetClassProto(ctx, e->call_site_class);
    ok = JS_DefinePropertyValueStr(ctx, call_site, "getFunction",
                                   JS_DupValue(ctx, c->shell[SHELL_GET_FUNCTION]),
                                   JS_PROP_WRITABLE | JS_PROP_CONFIGURABLE) >= 0;
    JS_FreeValue(ctx, call_site);
    return ok && capture_builtins(c);
}

/* Defines a global, as an assignment would (writable, enumerable, configurable). */
static bool define_global(JSContext *ctx, JSValueConst global, const char *name, JSValue value)
{
    return JS_DefinePropertyValueStr(ctx, global, name, value, JS_PROP_C_W_E) >= 0;
}

/* `tools` and `ALL_TOOLS` of the cell's configured tools ([{name, description}]). */
static bool make_tools(cell_t *c, JSValueConst list, JSValue *tools, JSValue *all)
{
    JSContext *ctx = c->ctx;
    int64_t count = 0;
    *tools = JS_NewObject(ctx);
    *all = JS_NewArray(ctx);
    if (JS_IsException(*tools) || JS_IsException(*all) || JS_GetLength(ctx, list, &count) < 0)
        return false;
    for (int64_t i = 0; i < count; i++) {
        JSValue entry = JS_GetPropertyInt64(ctx, list, i);
        JSValue name = JS_GetPropertyStr(ctx, entry, "name");
        JSValue description = JS_GetPropertyStr(ctx, entry, "description");
        JS_FreeValue(ctx, entry);
        JSValue index = JS_NewInt64(ctx, i);
        JSValue fn = JS_Call(ctx, c->shell[SHELL_NESTED_TOOL], JS_UNDEFINED, 1, &index);
        JSAtom atom = JS_IsException(fn) ? JS_ATOM_NULL : JS_ValueToAtom(ctx, name);
        /* Defined, not assigned: `tools.__proto__ = f` would replace the object's prototype (a
           tool may be called `__proto__`) instead of adding a property. */
        bool ok = atom != JS_ATOM_NULL &&
                  JS_DefinePropertyValue(ctx, *tools, atom, fn, JS_PROP_C_W_E) >= 0;
        if (atom != JS_ATOM_NULL)
            JS_FreeAtom(ctx, atom);
        else
            JS_FreeValue(ctx, fn);
        JSValue item = ok ? JS_NewObject(ctx) : JS_EXCEPTION;
        ok = !JS_IsException(item) &&
             JS_DefinePropertyValueStr(ctx, item, "name", JS_DupValue(ctx, name),
                                       JS_PROP_C_W_E) >= 0 &&
             JS_DefinePropertyValueStr(ctx, item, "description", JS_DupValue(ctx, description),
                                       JS_PROP_C_W_E) >= 0 &&
             JS_DefinePropertyValueUint32(ctx, *all, (uint32_t)i, JS_DupValue(ctx, item), JS_PROP_C_W_E) >= 0;
        JS_FreeValue(ctx, item);
        JS_FreeValue(ctx, name);
        JS_FreeValue(ctx, description);
        if (!ok)
            return false;
    }
    return true;
}

/* The stored values' size, in characters of keys and JSON texts (UTF-16 code units: bytes for
   ASCII): this cell sees the values as of its start plus its own writes, and that is what it
   counts against the session's limit. */
static bool count_stored(cell_t *c)
{
    JSContext *ctx = c->ctx;
    JSPropertyEnum *names = NULL;
    uint32_t count = 0;
    if (JS_GetOwnPropertyNames(ctx, &names, &count, c->stored, JS_GPN_STRING_MASK) < 0)
        return false;
    bool ok = true;
    for (uint32_t i = 0; i < count && ok; i++) {
        JSValue key = JS_AtomToString(ctx, names[i].atom);
        JSValue json = JS_GetProperty(ctx, c->stored, names[i].atom);
        ok = !JS_IsException(key) && !JS_IsException(json);
        if (ok)
            c->stored_size += text_length(ctx, key) + text_length(ctx, json);
        JS_FreeValue(ctx, key);
        JS_FreeValue(ctx, json);
    }
    JS_FreePropertyEnum(ctx, names, count);
    return ok;
}

/* The cell's own part, when it starts: its configuration ({tools: [{name, description}],
   stored: {key: "<JSON text>"}, store_load: bool, stored_limit: number}) and the globals it
   makes (`store` and `load` only with store_load). False with an exception pending. */
static bool configure_globals(cell_t *c, const char *json, size_t len)
{
    JSContext *ctx = c->ctx;
    JSValue config = JS_ParseJSON(ctx, json, len, "<config>");
    if (JS_IsException(config))
        return false;
    JSValue limit = JS_GetPropertyStr(ctx, config, "stored_limit");
    JSValue store_load = JS_GetPropertyStr(ctx, config, "store_load");
    JSValue list = JS_GetPropertyStr(ctx, config, "tools");
    int with_store = JS_ToBool(ctx, store_load);
    bool ok = !JS_IsException(list) && with_store >= 0 &&
              JS_ToInt64(ctx, &c->stored_limit, limit) == 0;
    if (ok && with_store) {
        c->stored = JS_GetPropertyStr(ctx, config, "stored");
        ok = JS_IsObject(c->stored) && (!c->stored_limit || count_stored(c));
    }
    JSValue tools = JS_UNDEFINED, all = JS_UNDEFINED;
    ok = ok && make_tools(c, list, &tools, &all);
    JS_FreeValue(ctx, list);
    JS_FreeValue(ctx, store_load);
    JS_FreeValue(ctx, limit);
    JS_FreeValue(ctx, config);
    if (!ok) {
        JS_FreeValue(ctx, tools);
        JS_FreeValue(ctx, all);
        return false;
    }
    JSValue global = JS_GetGlobalObject(ctx);
    ok = define_global(ctx, global, "tools", tools) && define_global(ctx, global, "ALL_TOOLS", all);
    static const struct {
        const char *name;
        int shell;
    } faces[] = {
        {"clearTimeout", SHELL_CLEAR_TIMEOUT},
        {"setTimeout", SHELL_SET_TIMEOUT},
        {"text", SHELL_TEXT},
        {"image", SHELL_IMAGE},
        {"generatedImage", SHELL_GENERATED_IMAGE},
        {"notify", SHELL_NOTIFY},
        {"yield_control", SHELL_YIELD_CONTROL},
        {"exit", SHELL_EXIT},
        {"store", SHELL_STORE},
        {"load", SHELL_LOAD},
    };
    /* A session without stored values (reference StoreLoadMode) has no store/load at all. */
    int count = with_store ? 10 : 8;
    for (int i = 0; i < count && ok; i++)
        ok = define_global(ctx, global, faces[i].name, JS_DupValue(ctx, c->shell[faces[i].shell]));
    JS_FreeValue(ctx, global);
    return ok;
}

/* Settles tool call `tool-<id>`: rejects it with an error text (SETTLE_REJECT), resolves it
   with the value of a JSON text (SETTLE_JSON) or with a text itself (SETTLE_TEXT, rule 3), or
   rejects it with an `Error` of the cell's realm whose message is the text (SETTLE_REJECT_ERROR:
   a denied call, which the cell catches as an Error, not as the reference's plain string).
   False with an exception pending, which fails the cell. */
static bool settle_tool_call(cell_t *c, command_t *cmd)
{
    JSContext *ctx = c->ctx;
    bool found = false;
    JSAtom atom = JS_IsUndefined(c->calls) || cmd->id < 1 || cmd->id > UINT32_MAX
                      ? JS_ATOM_NULL
                      : JS_NewAtomUInt32(ctx, (uint32_t)cmd->id);
    JSValue pair = atom == JS_ATOM_NULL ? JS_UNDEFINED : own_value(ctx, c->calls, atom, &found);
    if (found)
        JS_DeleteProperty(ctx, c->calls, atom, 0);
    if (atom != JS_ATOM_NULL)
        JS_FreeAtom(ctx, atom);
    if (JS_IsException(pair))
        return false;
    if (!found) {
        char text[64];
        snprintf(text, sizeof text, "unknown tool call `tool-%lld`", (long long)cmd->id);
        throw_text(ctx, text);
        return false;
    }
    JSValue value;
    if (cmd->settle == SETTLE_JSON)
        value = JS_ParseJSON(ctx, cmd->data, cmd->len, "<input>");
    else
        value = JS_NewStringLen(ctx, cmd->data, cmd->len);
    bool reject = cmd->settle == SETTLE_REJECT || cmd->settle == SETTLE_REJECT_ERROR;
    if (cmd->settle == SETTLE_REJECT_ERROR && !JS_IsException(value)) {
        JSValue error = JS_NewError(ctx);
        if (JS_IsException(error)) {
            JS_FreeValue(ctx, value);
            value = JS_EXCEPTION;
        } else if (JS_DefinePropertyValueStr(ctx, error, "message", value,
                                             JS_PROP_WRITABLE | JS_PROP_CONFIGURABLE) < 0) {
            JS_FreeValue(ctx, error); /* the message was freed by the failed definition */
            value = JS_EXCEPTION;
        } else {
            value = error;
        }
    }
    JSValue fn = JS_IsException(value) ? JS_EXCEPTION
                                       : JS_GetPropertyUint32(ctx, pair, reject ? 1 : 0);
    JSValue r = JS_IsException(fn) ? JS_EXCEPTION
                                   : JS_Call(ctx, fn, JS_UNDEFINED, 1, (JSValueConst *)&value);
    JS_FreeValue(ctx, fn);
    JS_FreeValue(ctx, value);
    JS_FreeValue(ctx, pair);
    if (JS_IsException(r))
        return false;
    JS_FreeValue(ctx, r);
    return true;
}

/* Fires timer `id` (if it is still set): its callback runs, and what it throws fails the cell
   (design.md, runtime 3.11). False with that exception pending. */
static bool fire_timer(cell_t *c, int64_t id)
{
    JSContext *ctx = c->ctx;
    if (JS_IsUndefined(c->timers) || id < 1 || id > UINT32_MAX)
        return true;
    JSAtom atom = JS_NewAtomUInt32(ctx, (uint32_t)id);
    bool found = false;
    JSValue callback = atom == JS_ATOM_NULL ? JS_EXCEPTION : own_value(ctx, c->timers, atom, &found);
    if (found) {
        JS_DeleteProperty(ctx, c->timers, atom, 0);
        c->pending_timers--;
    }
    if (atom != JS_ATOM_NULL)
        JS_FreeAtom(ctx, atom);
    if (JS_IsException(callback))
        return false;
    if (!found)
        return true;
    JSValue r = JS_Call(ctx, callback, JS_UNDEFINED, 0, NULL);
    JS_FreeValue(ctx, callback);
    if (JS_IsException(r))
        return false;
    JS_FreeValue(ctx, r);
    return true;
}

/* The values a cell holds in its runtime, before it has any. */
static void cell_values_init(cell_t *c)
{
    c->module_promise = JS_UNDEFINED;
    c->stored = c->timers = c->calls = c->images = JS_UNDEFINED;
    for (int i = 0; i < SHELL_COUNT; i++)
        c->shell[i] = JS_UNDEFINED;
    for (int i = 0; i < BUILTIN_COUNT; i++)
        c->builtin[i] = JS_UNDEFINED;
}

#ifndef NDEBUG
/* Lets go of the values a cell holds in its runtime (only a debug build frees them one by one:
   rule 12). */
static void cell_values_free(cell_t *c)
{
    JS_FreeValue(c->ctx, c->module_promise);
    JS_FreeValue(c->ctx, c->stored);
    JS_FreeValue(c->ctx, c->timers);
    JS_FreeValue(c->ctx, c->calls);
    JS_FreeValue(c->ctx, c->images);
    for (int i = 0; i < SHELL_COUNT; i++)
        JS_FreeValue(c->ctx, c->shell[i]);
    for (int i = 0; i < BUILTIN_COUNT; i++)
        JS_FreeValue(c->ctx, c->builtin[i]);
}
#endif

/* ---------------------------------------------------------------------------------------- */
/* Turns                                                                                    */

/* Frees the cell's runtime: all its blocks at once (rule 12). */
static void free_js(cell_t *c)
{
    if (!c->rt)
        return;
    c->heap_enforced = false;
    /* What the runtime holds is about to be freed (rule 10). */
    atomic_fetch_add_explicit(&c->engine->freed_since_trim, c->heap_used, memory_order_relaxed);
#ifndef NDEBUG
    /* A debug build frees the runtime object by object first, so that QuickJS-ng's assertions
       catch a JS value the binding leaked (setup.py: CODEMODE_DEBUG_BUILD). See evaluate_cell
       for why no module is left suspended. */
    JS_UpdateStackTop(c->rt);
    cell_values_free(c);
    JS_FreeContext(c->ctx);
    JS_FreeRuntime(c->rt);
#endif
    heap_blocks_free(c);
    cell_values_init(c);
    c->rt = NULL;
    c->ctx = NULL;
    heap_release(c);
}

#define WRAPPER_HEAD "export default (0, async () => {\n\n"
#define WRAPPER_TAIL "\n});\n"

/* Runs the cell's source as the ES module the reference evaluates, and returns the promise of
   its completion.

   Why not a plain module with top-level await: QuickJS-ng 0.17 frees a context's module records
   before the callbacks of a module still suspended at a top-level `await` (the common case of a
   cell terminated while it awaits a tool), which then write into freed memory at teardown
   (found with AddressSanitizer). So the source is first compiled as a module, which reports
   syntax errors and refuses imports exactly as the reference does, and is then run as the body
   of an anonymous async arrow function exported by a synchronous module: strict, `this`
   undefined, `await` allowed, and no module is ever left suspended. The wrapper's head takes
   lines -1 and 0, so positions in stacks are the source's own. (An `export` statement, legal
   in a module, is a SyntaxError in the body; it has no use in a cell.) */
static JSValue evaluate_cell(JSContext *ctx, const char *source, size_t len)
{
    JSValue checked = JS_Eval(ctx, source, len, MODULE_NAME,
                              JS_EVAL_TYPE_MODULE | JS_EVAL_FLAG_COMPILE_ONLY);
    if (JS_IsException(checked))
        return JS_EXCEPTION;
    JS_FreeValue(ctx, checked);

    size_t head = strlen(WRAPPER_HEAD), tail = strlen(WRAPPER_TAIL);
    char *wrapped = malloc(head + len + tail + 1);
    if (!wrapped)
        return JS_ThrowOutOfMemory(ctx);
    memcpy(wrapped, WRAPPER_HEAD, head);
    memcpy(wrapped + head, source, len);
    memcpy(wrapped + head + len, WRAPPER_TAIL, tail + 1);
    JSEvalOptions options = {
        .version = JS_EVAL_OPTIONS_VERSION,
        .eval_flags = JS_EVAL_TYPE_MODULE | JS_EVAL_FLAG_COMPILE_ONLY,
        .filename = MODULE_NAME,
        .line_num = -1,
    };
    JSValue module = JS_Eval2(ctx, wrapped, head + len + tail, &options);
    free(wrapped);
    if (JS_IsException(module))
        return JS_EXCEPTION;
    JSModuleDef *def = JS_VALUE_GET_PTR(module);
    JSValue evaluated = JS_EvalFunction(ctx, module);
    if (JS_IsException(evaluated))
        return JS_EXCEPTION;
    JS_FreeValue(ctx, evaluated);
    JSValue namespace = JS_GetModuleNamespace(ctx, def);
    if (JS_IsException(namespace))
        return JS_EXCEPTION;
    JSValue body = JS_GetPropertyStr(ctx, namespace, "default");
    JS_FreeValue(ctx, namespace);
    if (JS_IsException(body))
        return JS_EXCEPTION;
    JSValue promise = JS_Call(ctx, body, JS_UNDEFINED, 0, NULL);
    JS_FreeValue(ctx, body);
    return promise;
}

/* The globals a cell may keep (design.md, runtime 3.2's allowlist, less the helpers the prelude
   adds itself), in strcmp order for bsearch. Names QuickJS-ng lacks (Intl, Temporal, the
   reference's internals) are harmless here. */
static const char *const allowed_globals[] = {
    "AggregateError", "Array", "ArrayBuffer", "AsyncDisposableStack", "BigInt", "BigInt64Array",
    "BigUint64Array", "Boolean", "DataView", "Date", "DisposableStack", "Error", "EvalError",
    "FinalizationRegistry", "Float16Array", "Float32Array", "Float64Array", "Function", "Infinity",
    "Int16Array", "Int32Array", "Int8Array", "Intl", "Iterator", "JSON", "Map", "Math", "NaN",
    "Number", "Object", "Promise", "Proxy", "RangeError", "ReferenceError", "Reflect", "RegExp",
    "Set", "String", "SuppressedError", "Symbol", "SyntaxError", "Temporal", "TypeError",
    "URIError", "Uint16Array", "Uint32Array", "Uint8Array", "Uint8ClampedArray", "WeakMap",
    "WeakRef", "WeakSet", "__codexContentItems", "add_content", "decodeURI", "decodeURIComponent",
    "encodeURI", "encodeURIComponent", "escape", "eval", "globalThis", "isFinite", "isNaN",
    "parseFloat", "parseInt", "undefined", "unescape",
};

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The string-named globals of a fresh context that the allowlist does not hold
   (`InternalError`, `queueMicrotask`, `SharedArrayBuffer` and `Atomics` in QuickJS-ng 0.17, and
   whatever a later version adds): found once per process (find_disallowed_globals), in a
   scratch context with the intrinsics every cell gets, and deleted by name in each cell.
   Listing a cell's globals and looking each one up took 3 % of a trivial cell's instructions
   in the engine. Set under the GIL, before any engine runs. */
static char **disallowed_globals;
static int disallowed_count = -1;

static bool add_cell_intrinsics(JSContext *ctx)
{
    return !(JS_AddIntrinsicBaseObjects(ctx) || JS_AddIntrinsicDate(ctx) ||
             JS_AddIntrinsicEval(ctx) || JS_AddIntrinsicRegExp(ctx) || JS_AddIntrinsicJSON(ctx) ||
             JS_AddIntrinsicProxy(ctx) || JS_AddIntrinsicMapSet(ctx) ||
             JS_AddIntrinsicTypedArrays(ctx) || JS_AddIntrinsicPromise(ctx) ||
             JS_AddIntrinsicWeakRef(ctx));
}

/* Fills disallowed_globals, once; false with a Python exception set if it failed. */
static bool find_disallowed_globals(void)
{
    if (disallowed_count >= 0)
        return true;
    JSRuntime *rt = JS_NewRuntime();
    JSContext *ctx = rt ? JS_NewContextRaw(rt) : NULL;
    JSPropertyEnum *names = NULL;
    uint32_t count = 0;
    bool ok = ctx && add_cell_intrinsics(ctx);
    JSValue global = ok ? JS_GetGlobalObject(ctx) : JS_UNDEFINED;
    ok = ok && JS_GetOwnPropertyNames(ctx, &names, &count, global, JS_GPN_STRING_MASK) == 0;
    char **found = ok ? calloc(count ? count : 1, sizeof(char *)) : NULL;
    int n = 0;
    ok = found != NULL;
    for (uint32_t i = 0; ok && i < count; i++) {
        const char *name = JS_AtomToCString(ctx, names[i].atom);
        ok = name != NULL;
        if (ok && !bsearch(&name, allowed_globals, sizeof(allowed_globals) / sizeof(char *),
                           sizeof(char *), compare_names))
            ok = (found[n++] = strdup(name)) != NULL;
        JS_FreeCString(ctx, name);
    }
    if (names)
        JS_FreePropertyEnum(ctx, names, count);
    if (ctx) {
        JS_FreeValue(ctx, global);
        JS_FreeContext(ctx);
    }
    if (rt)
        JS_FreeRuntime(rt);
    if (!ok) {
        for (int i = 0; found && i < n; i++)
            free(found[i]);
        free(found);
        PyErr_NoMemory();
        return false;
    }
    disallowed_globals = found;
    disallowed_count = n;
    return true;
}

/* Deletes the disallowed globals from a cell's context; false with an exception pending if it
   failed. */
static bool remove_disallowed_globals(JSContext *ctx)
{
    JSValue global = JS_GetGlobalObject(ctx);
    bool ok = true;
    for (int i = 0; ok && i < disallowed_count; i++) {
        JSAtom atom = JS_NewAtom(ctx, disallowed_globals[i]);
        ok = atom != JS_ATOM_NULL && JS_DeleteProperty(ctx, global, atom, 0) >= 0;
        if (atom != JS_ATOM_NULL)
            JS_FreeAtom(ctx, atom);
    }
    JS_FreeValue(ctx, global);
    return ok;
}

/* A context with the intrinsics a cell may keep: JS_NewContext's, less `atob`/`btoa` and
   `performance`, which are not even added, and less the globals the allowlist lacks. */
static JSContext *new_cell_context(JSRuntime *rt)
{
    JSContext *ctx = JS_NewContextRaw(rt);
    if (!ctx)
        return NULL;
    if (!add_cell_intrinsics(ctx) || !remove_disallowed_globals(ctx)) {
        JS_FreeContext(ctx);
        return NULL;
    }
    return ctx;
}

/* Creates the cell's runtime and context and prepares its globals (or records that this
   threw, for start_cell to report); false (and nothing allocated) if memory ran out. Runs on a
   worker, ahead of use for a prepared cell (rule 9). */
static bool create_runtime(cell_t *c)
{
    c->heap_enforced = true;
    cell_values_init(c);
    c->globals_failed = false;
    heap_blocks_init(c);
    c->rt = JS_NewRuntime2(&cell_malloc_functions, c);
    if (!c->rt) {
        heap_blocks_free(c);
        heap_release(c);
        return false;
    }
    JS_SetRuntimeOpaque(c->rt, c);
    JS_UpdateStackTop(c->rt);
    JS_SetInterruptHandler(c->rt, interrupt_handler, c);
    JS_SetModuleLoaderFunc(c->rt, refuse_import, never_load, NULL);
    c->ctx = new_cell_context(c->rt);
    if (!c->ctx) {
        heap_blocks_free(c);
        c->rt = NULL;
        heap_release(c);
        return false;
    }
    c->globals_failed = !prepare_globals(c);
    return true;
}

/* A prepared cell (rule 9), or NULL if memory ran out. */
static cell_t *prepare_cell(engine_t *e)
{
    cell_t *c = calloc(1, sizeof(cell_t));
    if (!c)
        return NULL;
    c->engine = e;
    c->finish_node = calloc(1, sizeof(finish_node_t));
    if (c->finish_node && create_runtime(c) && !c->globals_failed)
        return c;
    if (c->ctx && c->globals_failed)
        JS_FreeValue(c->ctx, JS_GetException(c->ctx));
    free_js(c);
    free(c->finish_node);
    free(c);
    return NULL;
}

/* Configures the cell's globals (creating the runtime first unless the cell was prepared), then
   evaluates the cell's source. */
static void start_cell(cell_t *c, command_t *cmd)
{
    struct timespec begin, end;
    clock_gettime(CLOCK_MONOTONIC, &begin);
    if (!c->rt && !create_runtime(c)) {
        finish(c, OUTCOME_ERROR, dup_bytes("InternalError: out of memory", 28), 28);
        return;
    }
    JS_SetMaxStackSize(c->rt, c->stack_limit);
    if (c->globals_failed || !configure_globals(c, cmd->data2, cmd->len2)) {
        finish_with_exception(c);
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    int64_t setup_ns = (int64_t)(end.tv_sec - begin.tv_sec) * 1000000000 +
                       (end.tv_nsec - begin.tv_nsec);
    publish(c, EV_STARTED, setup_ns, 0, NULL, 0, NULL, 0);

    JSValue promise = evaluate_cell(c->ctx, cmd->data, cmd->len);
    if (JS_IsException(promise)) {
        finish_with_exception(c);
        return;
    }
    c->module_promise = promise;
    settle(c);
}

/* Settles a tool call or fires a timer. An exception either lets escape ends the cell (a
   throwing timer callback fails the cell, design.md, runtime 3.11). */
static void dispatch(cell_t *c, command_t *cmd)
{
    bool ok = cmd->kind == CMD_SETTLE_TOOL ? settle_tool_call(c, cmd) : fire_timer(c, cmd->id);
    if (!ok) {
        finish_with_exception(c);
        return;
    }
    settle(c);
}

static void run_turn(cell_t *c, command_t *cmds)
{
    c->turn_start_ns = thread_cpu_ns();
    if (c->rt)
        JS_UpdateStackTop(c->rt);
    for (command_t *cmd = cmds; cmd; cmd = cmd->next) {
        if (cmd->kind == CMD_CLOSE) {
            free_js(c);
            c->finished = true;
            continue;
        }
        if (cmd->kind != CMD_WAKE)
            c->commands_taken++;
        if (c->finished)
            continue;
        if (finish_if_stopped(c))
            continue;
        switch (cmd->kind) {
        case CMD_START:
            start_cell(c, cmd);
            break;
        case CMD_SETTLE_TOOL:
        case CMD_FIRE_TIMER:
            if (c->ctx)
                dispatch(c, cmd);
            break;
        case CMD_WAKE:
            break;
        }
    }
    free_commands(cmds);
    int64_t now = thread_cpu_ns();
    c->cpu_ns += now - c->turn_start_ns;
    c->turn_start_ns = now; /* cpu_used_up below counts nothing twice */
    if (!c->finished && c->ctx) {
        cpu_used_up(c); /* also a cell whose many short turns add up */
        publish(c, EV_IDLE, c->commands_taken, c->cpu_ns / 1000, NULL, 0, NULL, 0);
        finish_if_stopped(c); /* the idle event itself may be the one that was lost */
    }
    if (c->finished)
        free_js(c); /* rule 11 */
}

/* ---------------------------------------------------------------------------------------- */
/* Scheduling                                                                               */

static void cell_release(cell_t *c)
{
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    free_js(c);
    free_commands(c->cmd_head);
    free(c->finish_node);
    free(c);
}

/* Who queued work wakes, signalled once the caller let go of e->lock (rule 14). */
typedef enum { WAKE_NOBODY, WAKE_WORKER, WAKE_MONITOR } wake_t;

static void wake(engine_t *e, wake_t who)
{
    if (who == WAKE_WORKER)
        pthread_cond_signal(&e->work);
    else if (who == WAKE_MONITOR)
        pthread_cond_signal(&e->starved);
}

/* Rule 5: work is queued and no worker is free. A monitor already watching a stall checks at
   its deadline anyway; waking it for every command queued while the workers are busy cost a
   wake-up and a contended lock per tool call under load. */
static wake_t monitor_wake_locked(engine_t *e)
{
    return e->monitor_resting && e->nthreads < e->max_workers ? WAKE_MONITOR : WAKE_NOBODY;
}

/* Queues a command; the caller holds e->lock, and wakes `*who` once it let go of it. Returns
   false if the engine no longer runs. */
static bool enqueue_locked(engine_t *e, cell_t *c, command_t *cmd, wake_t *who)
{
    *who = WAKE_NOBODY;
    if (e->joined || (e->stopping && cmd->kind != CMD_CLOSE))
        return false;
    cmd->next = NULL;
    if (c->cmd_tail)
        c->cmd_tail->next = cmd;
    else
        c->cmd_head = cmd;
    c->cmd_tail = cmd;
    if (!c->scheduled) {
        c->scheduled = true;
        atomic_fetch_add(&c->refs, 1);
        c->run_next = NULL;
        if (e->rq_tail)
            e->rq_tail->run_next = c;
        else
            e->rq_head = c;
        e->rq_tail = c;
        *who = e->idle > 0 ? WAKE_WORKER : monitor_wake_locked(e);
    }
    return true;
}

static bool enqueue(engine_t *e, cell_t *c, command_t *cmd)
{
    wake_t who;
    pthread_mutex_lock(&e->lock);
    bool queued = enqueue_locked(e, c, cmd, &who);
    pthread_mutex_unlock(&e->lock);
    wake(e, who);
    return queued;
}

/* Rule 15: the pool is short of prepared cells and the preparer rests; the caller holds
   e->lock, and signals prepare_wanted once it let go of it. */
static bool refill_wanted_locked(engine_t *e)
{
    return e->preparer_resting && !e->prepare_failed && !e->stopping &&
           e->nprepared < e->prepared_target;
}

static void *worker_main(void *arg)
{
    engine_t *e = arg;
    pthread_mutex_lock(&e->lock);
    for (;;) {
        while (!e->rq_head && !e->stopping) {
            if (!e->trimming && e->live_count == 0 &&
                atomic_load_explicit(&e->freed_since_trim, memory_order_relaxed) >= TRIM_AFTER) {
                e->trimming = true; /* rule 10 */
                atomic_store(&e->freed_since_trim, 0);
                pthread_mutex_unlock(&e->lock);
                malloc_trim(0);
                pthread_mutex_lock(&e->lock);
                e->trimming = false;
                e->trims++;
                pthread_cond_broadcast(&e->prepared_changed);
                continue;
            }
            e->idle++;
            pthread_cond_wait(&e->work, &e->lock);
            e->idle--;
        }
        cell_t *c = e->rq_head;
        if (!c)
            break; /* stopping, and nothing left to run */
        e->rq_head = c->run_next;
        if (!e->rq_head)
            e->rq_tail = NULL;
        command_t *cmds = c->cmd_head;
        c->cmd_head = c->cmd_tail = NULL;
        /* Work left behind and nobody free: the monitor watches it. */
        wake_t who = e->rq_head && e->idle == 0 ? monitor_wake_locked(e) : WAKE_NOBODY;
        pthread_mutex_unlock(&e->lock);
        wake(e, who);

        run_turn(c, cmds);

        pthread_mutex_lock(&e->lock);
        e->turns_completed++;
        c->js_freed = c->rt == NULL;
        bool refill = refill_wanted_locked(e);
        if (c->cmd_head) {
            /* More work arrived during the turn: back of the queue, for fairness. */
            c->run_next = NULL;
            if (e->rq_tail)
                e->rq_tail->run_next = c;
            else
                e->rq_head = c;
            e->rq_tail = c;
            if (refill) {
                pthread_mutex_unlock(&e->lock);
                pthread_cond_signal(&e->prepare_wanted);
                pthread_mutex_lock(&e->lock);
            }
        } else {
            c->scheduled = false;
            pthread_mutex_unlock(&e->lock);
            if (refill)
                pthread_cond_signal(&e->prepare_wanted);
            cell_release(c);
            pthread_mutex_lock(&e->lock);
        }
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

/* Rule 9: keeps the pool of prepared cells full, with CPU nobody else wants. */
static void *preparer_main(void *arg)
{
    engine_t *e = arg;
    pthread_mutex_lock(&e->lock);
    for (;;) {
        while (!e->stopping && (e->prepare_failed || e->nprepared >= e->prepared_target)) {
            e->preparer_resting = true;
            pthread_cond_wait(&e->prepare_wanted, &e->lock);
            e->preparer_resting = false;
        }
        if (e->stopping)
            break;
        pthread_mutex_unlock(&e->lock);
        cell_t *prepared = prepare_cell(e);
        pthread_mutex_lock(&e->lock);
        if (prepared) {
            prepared->prepared_next = e->prepared;
            e->prepared = prepared;
            e->nprepared++;
        } else {
            e->prepare_failed = true;
        }
        pthread_cond_broadcast(&e->prepared_changed);
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

/* Starts a thread of the engine, named and with its scheduling policy set before this returns
   (rule 13; both best effort). */
static bool start_thread(pthread_t *thread, size_t stack_size, void *(*main)(void *),
                         engine_t *e, const char *name, int policy)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (stack_size)
        pthread_attr_setstacksize(&attr, stack_size);
    int err = pthread_create(thread, &attr, main, e);
    pthread_attr_destroy(&attr);
    if (err)
        return false;
    struct sched_param param = {0};
    pthread_setschedparam(*thread, policy, &param);
    pthread_setname_np(*thread, name);
    return true;
}

/* Starts one more worker; the caller holds e->lock. */
static bool spawn_worker_locked(engine_t *e)
{
    if (e->nthreads >= e->max_workers)
        return false;
    if (!start_thread(&e->threads[e->nthreads], WORKER_STACK_SIZE, worker_main, e,
                      "codemode-worker", SCHED_BATCH))
        return false;
    e->nthreads++;
    return true;
}

static void monotonic_now(struct timespec *ts)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
}

/* The monotonic time `ns` nanoseconds from now. */
static void deadline_after(struct timespec *deadline, int64_t ns)
{
    monotonic_now(deadline);
    int64_t total = (int64_t)deadline->tv_nsec + ns;
    deadline->tv_sec += (time_t)(total / 1000000000);
    deadline->tv_nsec = (long)(total % 1000000000);
}

static bool reached(const struct timespec *deadline)
{
    struct timespec now;
    monotonic_now(&now);
    return now.tv_sec > deadline->tv_sec ||
           (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

static void *monitor_main(void *arg)
{
    engine_t *e = arg;
    uint64_t watched = UINT64_MAX;
    struct timespec deadline = {0, 0};
    pthread_mutex_lock(&e->lock);
    while (!e->stopping) {
        bool stalled = e->rq_head && e->idle == 0 && e->nthreads < e->max_workers;
        if (!stalled) {
            watched = UINT64_MAX;
            e->monitor_resting = true;
            pthread_cond_wait(&e->starved, &e->lock);
            e->monitor_resting = false;
            continue;
        }
        if (watched != e->turns_completed) {
            /* Progress since the last look (or a first look): start the clock again. */
            watched = e->turns_completed;
            deadline_after(&deadline, STARVATION_NS);
        }
        if (reached(&deadline)) {
            spawn_worker_locked(e);
            watched = UINT64_MAX;
            continue;
        }
        pthread_cond_timedwait(&e->starved, &e->lock, &deadline);
    }
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Python types                                                                             */

typedef struct {
    PyObject *EngineType;
    PyObject *CellType;
    PyObject *EngineClosedError;
} module_state;

typedef struct {
    PyObject_HEAD
    engine_t *engine;
} EngineObject;

typedef struct {
    PyObject_HEAD
    cell_t *cell;
    PyObject *engine;
} CellObject;

static module_state *get_state(PyObject *module)
{
    return (module_state *)PyModule_GetState(module);
}

static struct PyModuleDef quickjs_module;

static PyObject *raise_closed(PyObject *self)
{
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &quickjs_module);
    if (!module)
        return NULL;
    PyErr_SetString(get_state(module)->EngineClosedError, "the engine is closed");
    return NULL;
}

static command_t *new_command(int kind)
{
    command_t *cmd = calloc(1, sizeof(command_t));
    if (!cmd)
        PyErr_NoMemory();
    else
        cmd->kind = kind;
    return cmd;
}

/* Compiles a prelude script in a scratch runtime; returns malloc'd bytecode, or NULL with a
   Python exception set. */
static uint8_t *compile_prelude(const char *source, size_t len, const char *filename,
                                size_t *out_len)
{
    JSRuntime *rt = JS_NewRuntime();
    JSContext *ctx = rt ? JS_NewContext(rt) : NULL;
    uint8_t *copy = NULL;
    if (!ctx) {
        if (rt)
            JS_FreeRuntime(rt);
        PyErr_NoMemory();
        return NULL;
    }
    JSValue fn = JS_Eval(ctx, source, len, filename,
                         JS_EVAL_TYPE_GLOBAL | JS_EVAL_FLAG_STRICT | JS_EVAL_FLAG_COMPILE_ONLY);
    if (JS_IsException(fn)) {
        JSValue exc = JS_GetException(ctx);
        const char *text = JS_ToCString(ctx, exc);
        PyErr_Format(PyExc_ValueError, "%s does not compile: %s", filename, text ? text : "?");
        JS_FreeCString(ctx, text);
        JS_FreeValue(ctx, exc);
    } else {
        size_t n = 0;
        /* Without the functions' source text, which every cell would read again (5 % of its
           creation): a helper's toString() reads `[native code]`, as V8's native helpers do.
           Line numbers stay, for the frames of stack traces. */
        uint8_t *bytecode =
            JS_WriteObject(ctx, &n, fn, JS_WRITE_OBJ_BYTECODE | JS_WRITE_OBJ_STRIP_SOURCE);
        if (bytecode && (copy = malloc(n))) {
            memcpy(copy, bytecode, n);
            *out_len = n;
        } else {
            PyErr_NoMemory();
        }
        js_free(ctx, bytecode);
        JS_FreeValue(ctx, fn);
    }
    JS_FreeContext(ctx);
    JS_FreeRuntime(rt);
    return copy;
}

/* The class id of QuickJS-ng's CallSite objects (the same in every runtime: a builtin class),
   found once in a scratch runtime, or 0 with a Python exception set. Each cell replaces its
   prototype's getFunction (prelude.js) without making a stack trace to find it. */
static JSClassID find_call_site_class(void)
{
    static const char source[] =
        "Error.prepareStackTrace = (_error, sites) => sites; new Error().stack[0]";
    JSRuntime *rt = JS_NewRuntime();
    JSContext *ctx = rt ? JS_NewContext(rt) : NULL;
    JSClassID id = 0;
    if (ctx) {
        JSValue site = JS_Eval(ctx, source, strlen(source), "<call-site>", JS_EVAL_TYPE_GLOBAL);
        if (JS_IsObject(site))
            id = JS_GetClassID(site);
        JS_FreeValue(ctx, site);
        JS_FreeValue(ctx, JS_GetException(ctx));
        JS_FreeContext(ctx);
    }
    if (rt)
        JS_FreeRuntime(rt);
    if (!id)
        PyErr_SetString(PyExc_RuntimeError, "cannot find QuickJS-ng's CallSite class");
    return id;
}

/* Engine(workers, prelude, images, max_workers, fault_events_after=-1, heap_budget=0,
          prepared_cells=0) */
static int Engine_init(EngineObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"workers",     "prelude",        "images",
                             "max_workers", "fault_events_after", "heap_budget",
                             "prepared_cells", NULL};
    int workers, max_workers, prepared_cells = 0;
    long long fault_events_after = -1;
    unsigned long long heap_budget = 0;
    Py_buffer prelude, images;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iy*y*i|LKi", kwlist, &workers, &prelude,
                                     &images, &max_workers, &fault_events_after, &heap_budget,
                                     &prepared_cells))
        return -1;
    engine_t *e = NULL;
    if (prepared_cells < 0 || prepared_cells > 1024) {
        PyErr_Format(PyExc_ValueError, "need 0 <= prepared_cells <= 1024, got %d",
                     prepared_cells);
    } else if (self->engine) {
        PyErr_SetString(PyExc_RuntimeError, "Engine.__init__ called twice");
    } else if (workers < 1 || max_workers < workers || max_workers > 1024) {
        PyErr_Format(PyExc_ValueError,
                     "need 1 <= workers <= max_workers <= 1024, got workers=%d, max_workers=%d",
                     workers, max_workers);
    } else if (!(e = calloc(1, sizeof(engine_t)))) {
        PyErr_NoMemory();
    } else {
        e->prelude = compile_prelude(prelude.buf, (size_t)prelude.len, "<prelude>",
                                     &e->prelude_len);
        if (e->prelude)
            e->images = compile_prelude(images.buf, (size_t)images.len, "<prelude-images>",
                                        &e->images_len);
        if (e->images &&
            (!find_disallowed_globals() || !(e->call_site_class = find_call_site_class()))) {
            free(e->images);
            e->images = NULL;
        }
    }
    PyBuffer_Release(&prelude);
    PyBuffer_Release(&images);
    if (!e)
        return -1;
    if (!e->images) { /* a script did not compile, or memory ran out */
        free(e->prelude);
        free(e);
        return -1;
    }
    e->efd = -1;
    e->prepared_target = prepared_cells;
    e->heap_budget = (size_t)heap_budget;
    atomic_init(&e->heap_total, 0);
    e->fault_events_after = fault_events_after < 0 ? -1 : fault_events_after;
    e->threads = calloc((size_t)max_workers, sizeof(pthread_t));
    e->max_workers = max_workers;
    e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!e->threads || e->efd < 0) {
        if (e->efd < 0)
            PyErr_SetFromErrno(PyExc_OSError);
        else
            PyErr_NoMemory();
        if (e->efd >= 0)
            close(e->efd);
        free(e->prelude);
        free(e->images);
        free(e->threads);
        free(e);
        return -1;
    }
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_mutex_init(&e->ev_lock, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&e->starved, &monotonic);
    pthread_cond_init(&e->prepared_changed, &monotonic);
    pthread_cond_init(&e->prepare_wanted, NULL);
    pthread_condattr_destroy(&monotonic);
    self->engine = e;

    /* Threads started before a failure are joined by close/dealloc. */
    pthread_mutex_lock(&e->lock);
    bool ok = true;
    for (int i = 0; i < workers && ok; i++)
        ok = spawn_worker_locked(e);
    if (ok)
        ok = e->monitor_started =
            start_thread(&e->monitor, 0, monitor_main, e, "codemode-watch", SCHED_BATCH);
    if (ok && e->prepared_target > 0)
        ok = e->preparer_started = start_thread(&e->preparer, WORKER_STACK_SIZE, preparer_main,
                                                e, "codemode-prep", SCHED_IDLE); /* rule 9 */
    pthread_mutex_unlock(&e->lock);
    if (!ok) {
        PyErr_SetString(PyExc_OSError, "cannot start the engine's threads");
        return -1;
    }
    return 0;
}

static void engine_stop(engine_t *e)
{
    pthread_mutex_lock(&e->lock);
    if (e->joined) {
        pthread_mutex_unlock(&e->lock);
        return;
    }
    e->stopping = true;
    for (cell_t *c = e->live; c; c = c->live_next)
        atomic_store(&c->interrupt, 1);
    pthread_cond_broadcast(&e->work);
    pthread_cond_broadcast(&e->starved);
    pthread_cond_broadcast(&e->prepare_wanted);
    pthread_mutex_unlock(&e->lock);
    /* The monitor first: once it is gone, no worker can be added. */
    if (e->monitor_started)
        pthread_join(e->monitor, NULL);
    if (e->preparer_started)
        pthread_join(e->preparer, NULL);
    for (int i = 0; i < e->nthreads; i++)
        pthread_join(e->threads[i], NULL);
    pthread_mutex_lock(&e->lock);
    e->joined = true;
    cell_t *prepared = e->prepared;
    e->prepared = NULL;
    e->nprepared = 0;
    pthread_mutex_unlock(&e->lock);
    while (prepared) {
        cell_t *next = prepared->prepared_next;
        free_js(prepared);
        free(prepared->finish_node);
        free(prepared);
        prepared = next;
    }
}

/* Joins the threads and closes the eventfd at once, so that closing an engine releases its
   threads and descriptor deterministically (not when the object is collected). */
static PyObject *Engine_close(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    engine_t *e = self->engine;
    if (e) {
        Py_BEGIN_ALLOW_THREADS
        engine_stop(e);
        Py_END_ALLOW_THREADS
        if (e->efd >= 0) {
            close(e->efd);
            e->efd = -1;
        }
    }
    Py_RETURN_NONE;
}

static void Engine_dealloc(EngineObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    engine_t *e = self->engine;
    if (e) {
        Py_BEGIN_ALLOW_THREADS
        engine_stop(e);
        Py_END_ALLOW_THREADS
        for (size_t i = 0; i < e->nevents; i++)
            free_event(&e->events[i]);
        free(e->events);
        while (e->finished_head) {
            finish_node_t *next = e->finished_head->next;
            free_event(&e->finished_head->ev);
            free(e->finished_head);
            e->finished_head = next;
        }
        if (e->efd >= 0)
            close(e->efd);
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->work);
        pthread_cond_destroy(&e->starved);
        pthread_cond_destroy(&e->prepared_changed);
        pthread_cond_destroy(&e->prepare_wanted);
        pthread_mutex_destroy(&e->ev_lock);
        free(e->prelude);
        free(e->images);
        free(e->threads);
        free(e);
    }
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *Engine_fileno(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(self->engine ? self->engine->efd : -1);
}

static PyObject *text_object(const char *s, size_t len)
{
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)len, "replace");
}

static PyObject *bytes_object(const char *s, size_t len)
{
    if (!s)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(s, (Py_ssize_t)len);
}

/* One event as (key, kind, n1, n2, a, b); JSON payloads (tool input, stored value) stay bytes. */
static PyObject *event_tuple(event_t *ev)
{
    PyObject *a, *b;
    if (ev->kind == EV_TOOL_CALL)
        a = bytes_object(ev->a, ev->alen);
    else
        a = text_object(ev->a, ev->alen);
    if (ev->kind == EV_STORE)
        b = bytes_object(ev->b, ev->blen);
    else
        b = text_object(ev->b, ev->blen);
    if (!a || !b) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    return Py_BuildValue("(LiLLNN)", (long long)ev->key, ev->kind, (long long)ev->n1,
                         (long long)ev->n2, a, b);
}

/* Takes every published event, in order, and clears the wake-up. */
static PyObject *Engine_drain(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    engine_t *e = self->engine;
    if (!e || e->efd < 0)
        return raise_closed((PyObject *)self);
    uint64_t count;
    while (read(e->efd, &count, sizeof(count)) < 0 && errno == EINTR)
        ;
    /* Clear before taking the events: a worker that publishes after this point writes the
       eventfd again, so no event is left without a wake-up. */
    atomic_store(&e->signalled, 0);
    pthread_mutex_lock(&e->ev_lock);
    event_t *events = e->events;
    size_t n = e->nevents;
    e->events = NULL;
    e->nevents = e->cap_events = 0;
    finish_node_t *finished = e->finished_head;
    e->finished_head = e->finished_tail = NULL;
    pthread_mutex_unlock(&e->ev_lock);

    /* A cell's other events were published before its finish: they come first. */
    size_t m = 0;
    for (finish_node_t *node = finished; node; node = node->next)
        m++;
    PyObject *list = PyList_New((Py_ssize_t)(n + m));
    for (size_t i = 0; i < n; i++) {
        if (list) {
            PyObject *item = event_tuple(&events[i]);
            if (!item)
                Py_CLEAR(list);
            else
                PyList_SET_ITEM(list, (Py_ssize_t)i, item);
        }
        free_event(&events[i]);
    }
    free(events);
    for (size_t i = n; finished; i++) {
        finish_node_t *next = finished->next;
        if (list) {
            PyObject *item = event_tuple(&finished->ev);
            if (!item)
                Py_CLEAR(list);
            else
                PyList_SET_ITEM(list, (Py_ssize_t)i, item);
        }
        free_event(&finished->ev);
        free(finished);
        finished = next;
    }
    return list;
}

static PyObject *Engine_heap_total(EngineObject *self, void *closure)
{
    (void)closure;
    if (!self->engine)
        return PyLong_FromLong(0);
    return PyLong_FromSize_t(atomic_load(&self->engine->heap_total));
}

static PyObject *Engine_prepared_cells(EngineObject *self, void *closure)
{
    (void)closure;
    if (!self->engine)
        return PyLong_FromLong(0);
    pthread_mutex_lock(&self->engine->lock);
    int n = self->engine->nprepared;
    pthread_mutex_unlock(&self->engine->lock);
    return PyLong_FromLong(n);
}

/* Blocks (without the GIL) until the pool holds `prepared_target` cells, a preparation failed,
   the engine stops, or `seconds` pass; whether the pool is full. */
static PyObject *Engine_wait_prepared(EngineObject *self, PyObject *arg)
{
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred())
        return NULL;
    engine_t *e = self->engine;
    if (!e)
        return raise_closed((PyObject *)self);
    struct timespec deadline;
    deadline_after(&deadline, (int64_t)(seconds * 1e9));
    bool full;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->lock);
    while (e->nprepared < e->prepared_target && !e->prepare_failed && !e->stopping &&
           !reached(&deadline))
        pthread_cond_timedwait(&e->prepared_changed, &e->lock, &deadline);
    full = e->nprepared >= e->prepared_target;
    pthread_mutex_unlock(&e->lock);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(full);
}

static PyObject *Engine_prepared_taken(EngineObject *self, void *closure)
{
    (void)closure;
    if (!self->engine)
        return PyLong_FromLong(0);
    pthread_mutex_lock(&self->engine->lock);
    int64_t n = self->engine->prepared_taken;
    pthread_mutex_unlock(&self->engine->lock);
    return PyLong_FromLongLong(n);
}

static PyObject *Engine_trims(EngineObject *self, void *closure)
{
    (void)closure;
    if (!self->engine)
        return PyLong_FromLong(0);
    pthread_mutex_lock(&self->engine->lock);
    int64_t n = self->engine->trims;
    pthread_mutex_unlock(&self->engine->lock);
    return PyLong_FromLongLong(n);
}

/* wait_trimmed(after, seconds): blocks (without the GIL) until more than `after` trims happened
   (rule 10), the engine stops, or `seconds` pass; the trims so far. */
static PyObject *Engine_wait_trimmed(EngineObject *self, PyObject *args)
{
    long long after;
    double seconds;
    if (!PyArg_ParseTuple(args, "Ld", &after, &seconds))
        return NULL;
    engine_t *e = self->engine;
    if (!e)
        return raise_closed((PyObject *)self);
    struct timespec deadline;
    deadline_after(&deadline, (int64_t)(seconds * 1e9));
    int64_t trims;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->lock);
    while (e->trims <= after && !e->stopping && !reached(&deadline))
        pthread_cond_timedwait(&e->prepared_changed, &e->lock, &deadline);
    trims = e->trims;
    pthread_mutex_unlock(&e->lock);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(trims);
}

/* trim(): gives freed memory back to the system now, as rule 10 does (blocks without the GIL).
   The host asks for it once it freed its own objects after the cells ended: rule 10's trim runs
   as the last cell is freed, before the Python objects that served the cells are. */
static PyObject *Engine_trim(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
    engine_t *e = self->engine;
    if (!e)
        return raise_closed((PyObject *)self);
    Py_BEGIN_ALLOW_THREADS
    malloc_trim(0);
    pthread_mutex_lock(&e->lock);
    e->trims++;
    pthread_cond_broadcast(&e->prepared_changed);
    pthread_mutex_unlock(&e->lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Engine_live_cells(EngineObject *self, void *closure)
{
    (void)closure;
    if (!self->engine)
        return PyLong_FromLong(0);
    pthread_mutex_lock(&self->engine->lock);
    Py_ssize_t n = self->engine->live_count;
    pthread_mutex_unlock(&self->engine->lock);
    return PyLong_FromSsize_t(n);
}

/* start_cell(key, source, config, heap_limit, stack_limit, cpu_limit_ms=0, output_limit=0)
   -> Cell (0: no limit) */
static PyObject *Engine_start_cell(EngineObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key",         "source",       "config",       "heap_limit",
                             "stack_limit", "cpu_limit_ms", "output_limit", NULL};
    long long key;
    Py_buffer source, config;
    unsigned long long heap_limit, stack_limit, cpu_limit_ms = 0, output_limit = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Ly*y*KK|KK", kwlist, &key, &source, &config,
                                     &heap_limit, &stack_limit, &cpu_limit_ms, &output_limit))
        return NULL;
    engine_t *e = self->engine;
    PyObject *result = NULL;
    command_t *cmd = NULL;
    cell_t *c = NULL;
    bool refill = false;
    if (!e || e->efd < 0) {
        raise_closed((PyObject *)self);
        goto done;
    }
    if (stack_limit > WORKER_STACK_SIZE - STACK_MARGIN) {
        PyErr_Format(PyExc_ValueError, "stack_limit must be at most %zu bytes",
                     WORKER_STACK_SIZE - STACK_MARGIN);
        goto done;
    }
    PyObject *module = PyType_GetModuleByDef(Py_TYPE(self), &quickjs_module);
    if (!module)
        goto done;
    cmd = new_command(CMD_START);
    pthread_mutex_lock(&e->lock);
    c = e->prepared; /* rule 9 */
    if (c) {
        e->prepared = c->prepared_next;
        c->prepared_next = NULL;
        e->nprepared--;
        e->prepared_taken++;
    }
    e->prepare_failed = false;
    /* Rule 15: the worker that runs this start wakes the preparer after its turn, unless the
       pool ran dry. */
    refill = e->nprepared == 0 && refill_wanted_locked(e);
    pthread_mutex_unlock(&e->lock);
    if (!c) {
        c = calloc(1, sizeof(cell_t));
        if (c)
            c->finish_node = calloc(1, sizeof(finish_node_t));
    }
    if (!cmd || !c || !c->finish_node) {
        PyErr_NoMemory();
        goto done;
    }
    cmd->data = dup_bytes(source.buf, (size_t)source.len);
    cmd->len = (size_t)source.len;
    cmd->data2 = dup_bytes(config.buf, (size_t)config.len);
    cmd->len2 = (size_t)config.len;
    if (!cmd->data || !cmd->data2) {
        PyErr_NoMemory();
        goto done;
    }
    atomic_init(&c->refs, 1);
    atomic_init(&c->interrupt, 0);
    atomic_init(&c->faulted, 0);
    c->engine = e;
    c->key = key;
    c->heap_limit = (size_t)heap_limit;
    c->cpu_limit_ns = (int64_t)cpu_limit_ms * 1000000;
    c->output_limit = (int64_t)output_limit;
    atomic_init(&c->cpu_exceeded, 0);
    atomic_init(&c->output_bytes, 0);
    c->stack_limit = stack_limit ? (size_t)stack_limit : DEFAULT_JS_STACK;
    if (!c->rt)
        cell_values_init(c); /* a prepared cell holds its globals already */

    CellObject *obj = PyObject_New(CellObject, (PyTypeObject *)get_state(module)->CellType);
    if (!obj)
        goto done;
    obj->cell = NULL;
    obj->engine = Py_NewRef((PyObject *)self);

    wake_t who;
    pthread_mutex_lock(&e->lock);
    bool queued = enqueue_locked(e, c, cmd, &who);
    if (queued) {
        c->live_next = e->live;
        if (e->live)
            e->live->live_prev = c;
        e->live = c;
        e->live_count++;
    }
    pthread_mutex_unlock(&e->lock);
    wake(e, who);
    if (!queued) {
        Py_DECREF(obj);
        raise_closed((PyObject *)self);
        goto done;
    }
    obj->cell = c;
    result = (PyObject *)obj;
    cmd = NULL;
    c = NULL;
done:
    if (cmd)
        free_command(cmd);
    if (c) {
        free_js(c);
        free(c->finish_node);
    }
    free(c);
    PyBuffer_Release(&source);
    PyBuffer_Release(&config);
    /* The preparer is woken last, after the worker (rule 14): a wake-up costs its waker about
       10 us on a VM, which the cell's start need not wait for (nor, but for an empty pool,
       the calling thread: rule 15). */
    if (refill)
        pthread_cond_signal(&e->prepare_wanted);
    return result;
}

static PyMethodDef Engine_methods[] = {
    {"start_cell", (PyCFunction)(void (*)(void))Engine_start_cell, METH_VARARGS | METH_KEYWORDS,
     "Create a cell and queue its start: runtime, prelude, then the source as a module."},
    {"drain", (PyCFunction)Engine_drain, METH_NOARGS,
     "Take every event published since the last drain, as (key, kind, n1, n2, a, b) tuples."},
    {"fileno", (PyCFunction)Engine_fileno, METH_NOARGS,
     "The eventfd that becomes readable when events are waiting."},
    {"trim", (PyCFunction)Engine_trim, METH_NOARGS,
     "Give freed memory back to the system now (GIL released); counted in `trims`."},
    {"wait_trimmed", (PyCFunction)Engine_wait_trimmed, METH_VARARGS,
     "Block (GIL released) until more than `after` trims happened or `seconds` pass."},
    {"wait_prepared", (PyCFunction)Engine_wait_prepared, METH_O,
     "Block (GIL released) until the prepared-cell pool is full or `seconds` pass."},
    {"close", (PyCFunction)Engine_close, METH_NOARGS,
     "Interrupt every cell, finish queued work and join the worker threads."},
    {NULL, NULL, 0, NULL},
};

static PyObject *Engine_worker_threads(EngineObject *self, void *closure)
{
    (void)closure;
    if (!self->engine)
        return PyLong_FromLong(0);
    pthread_mutex_lock(&self->engine->lock);
    int n = self->engine->nthreads;
    pthread_mutex_unlock(&self->engine->lock);
    return PyLong_FromLong(n);
}

static PyGetSetDef Engine_getset[] = {
    {"live_cells", (getter)Engine_live_cells, NULL, "Cells created and not yet freed.", NULL},
    {"prepared_taken", (getter)Engine_prepared_taken, NULL,
     "Cells that started on a prepared runtime (rule 9).", NULL},
    {"trims", (getter)Engine_trims, NULL, "Times freed memory went back to the system (rule 10).",
     NULL},
    {"prepared_cells", (getter)Engine_prepared_cells, NULL,
     "Prepared runtimes waiting for a cell (rule 9).", NULL},
    {"heap_total", (getter)Engine_heap_total, NULL, "Bytes of heap all cells hold.", NULL},
    {"worker_threads", (getter)Engine_worker_threads, NULL, "Worker threads started so far.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Engine_slots[] = {
    {Py_tp_doc, "A pool of worker threads running QuickJS cells, and their event queue."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Engine_init},
    {Py_tp_dealloc, Engine_dealloc},
    {Py_tp_methods, Engine_methods},
    {Py_tp_getset, Engine_getset},
    {0, NULL},
};

static PyType_Spec Engine_spec = {
    "codemode_host._quickjs.Engine", sizeof(EngineObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, Engine_slots,
};

/* ---- Cell ---- */

static PyObject *submit(CellObject *self, command_t *cmd)
{
    if (!cmd)
        return NULL;
    if (!self->cell || !enqueue(self->cell->engine, self->cell, cmd)) {
        free_command(cmd);
        return raise_closed((PyObject *)self);
    }
    Py_RETURN_NONE;
}

static PyObject *Cell_settle_tool(CellObject *self, PyObject *args)
{
    long long call_id;
    int settle;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "Liy*", &call_id, &settle, &payload))
        return NULL;
    if (settle != SETTLE_REJECT && settle != SETTLE_JSON && settle != SETTLE_TEXT &&
        settle != SETTLE_REJECT_ERROR) {
        PyBuffer_Release(&payload);
        PyErr_Format(PyExc_ValueError,
                     "settle must be 0 (reject), 1 (JSON), 2 (text) or 3 (reject with an Error), "
                     "not %d",
                     settle);
        return NULL;
    }
    command_t *cmd = new_command(CMD_SETTLE_TOOL);
    if (cmd) {
        cmd->id = call_id;
        cmd->settle = settle;
        cmd->data = dup_bytes(payload.buf, (size_t)payload.len);
        cmd->len = (size_t)payload.len;
        if (!cmd->data) {
            free_command(cmd);
            cmd = NULL;
            PyErr_NoMemory();
        }
    }
    PyBuffer_Release(&payload);
    return submit(self, cmd);
}

static PyObject *Cell_fire_timer(CellObject *self, PyObject *arg)
{
    long long timer_id = PyLong_AsLongLong(arg);
    if (timer_id == -1 && PyErr_Occurred())
        return NULL;
    command_t *cmd = new_command(CMD_FIRE_TIMER);
    if (cmd)
        cmd->id = timer_id;
    return submit(self, cmd);
}

/* The runtime took `bytes` of the cell's output (rule 8): room for more. */
static PyObject *Cell_output_taken(CellObject *self, PyObject *arg)
{
    long long bytes = PyLong_AsLongLong(arg);
    if (bytes == -1 && PyErr_Occurred())
        return NULL;
    if (self->cell && bytes > 0)
        atomic_fetch_sub(&self->cell->output_bytes, bytes);
    Py_RETURN_NONE;
}

/* Callable without the GIL: an atomic store, then a wake-up under the engine's mutex. */
static void cell_interrupt(cell_t *c, command_t *wake)
{
    atomic_store(&c->interrupt, 1);
    if (!enqueue(c->engine, c, wake))
        free_command(wake);
}

static PyObject *Cell_interrupt(CellObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->cell)
        return raise_closed((PyObject *)self);
    command_t *wake = new_command(CMD_WAKE);
    if (!wake)
        return NULL;
    cell_t *c = self->cell;
    Py_BEGIN_ALLOW_THREADS
    cell_interrupt(c, wake);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* Stops the cell for good and frees its runtime (on a worker, or here once the workers are
   gone). Idempotent. */
static void cell_close(CellObject *self)
{
    cell_t *c = self->cell;
    if (!c)
        return;
    self->cell = NULL;
    engine_t *e = c->engine;
    atomic_store(&c->interrupt, 1);
    command_t *cmd = calloc(1, sizeof(command_t));
    pthread_mutex_lock(&e->lock);
    if (c->live_prev)
        c->live_prev->live_next = c->live_next;
    else
        e->live = c->live_next;
    if (c->live_next)
        c->live_next->live_prev = c->live_prev;
    e->live_count--;
    bool queued = false;
    wake_t who = WAKE_NOBODY;
    if (c->js_freed && !c->scheduled) {
        /* Nothing left for a worker to do (rule 11); one trims if this was the last cell. */
        if (e->live_count == 0 && e->idle > 0 && !e->trimming &&
            atomic_load_explicit(&e->freed_since_trim, memory_order_relaxed) >= TRIM_AFTER)
            who = WAKE_WORKER;
    } else if (cmd) {
        cmd->kind = CMD_CLOSE;
        queued = enqueue_locked(e, c, cmd, &who);
    }
    pthread_mutex_unlock(&e->lock);
    wake(e, who);
    if (!queued && cmd)
        free(cmd);
    /* Without a worker to run the close, cell_release frees the runtime on this thread. */
    cell_release(c);
}

static PyObject *Cell_close(CellObject *self, PyObject *Py_UNUSED(ignored))
{
    cell_close(self);
    Py_RETURN_NONE;
}

static PyObject *Cell_key(CellObject *self, void *closure)
{
    (void)closure;
    if (!self->cell)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(self->cell->key);
}

static void Cell_dealloc(CellObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    cell_close(self);
    Py_XDECREF(self->engine);
    PyObject_Free(self);
    Py_DECREF(tp);
}

static PyMethodDef Cell_methods[] = {
    {"settle_tool", (PyCFunction)Cell_settle_tool, METH_VARARGS,
     "settle_tool(call_id, settle, payload): reject (0, payload the error text), resolve with the "
     "value of JSON text (1) or with the text itself (2); payloads are UTF-8."},
    {"fire_timer", (PyCFunction)Cell_fire_timer, METH_O, "Run the callback of a timer."},
    {"output_taken", (PyCFunction)Cell_output_taken, METH_O,
     "output_taken(bytes): the runtime took that much of the cell's pending output."},
    {"interrupt", (PyCFunction)Cell_interrupt, METH_NOARGS,
     "Stop the cell's JavaScript; it then reports itself interrupted."},
    {"close", (PyCFunction)Cell_close, METH_NOARGS, "Interrupt the cell and free its runtime."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Cell_getset[] = {
    {"key", (getter)Cell_key, NULL, "The key its events carry (None once closed).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Cell_slots[] = {
    {Py_tp_doc, "One JavaScript cell: its own runtime and context, driven by commands."},
    {Py_tp_dealloc, Cell_dealloc},
    {Py_tp_methods, Cell_methods},
    {Py_tp_getset, Cell_getset},
    {0, NULL},
};

static PyType_Spec Cell_spec = {
    "codemode_host._quickjs.Cell", sizeof(CellObject), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    Cell_slots,
};

/* ---------------------------------------------------------------------------------------- */
/* Module                                                                                   */

static int module_exec(PyObject *module)
{
    module_state *st = get_state(module);
    st->EngineType = PyType_FromModuleAndSpec(module, &Engine_spec, NULL);
    st->CellType = PyType_FromModuleAndSpec(module, &Cell_spec, NULL);
    st->EngineClosedError = PyErr_NewExceptionWithDoc(
        "codemode_host._quickjs.EngineClosedError",
        "Raised when work is submitted to a closed engine or cell.", PyExc_RuntimeError, NULL);
    if (!st->EngineType || !st->CellType || !st->EngineClosedError)
        return -1;
    if (PyModule_AddObjectRef(module, "Engine", st->EngineType) < 0 ||
        PyModule_AddObjectRef(module, "Cell", st->CellType) < 0 ||
        PyModule_AddObjectRef(module, "EngineClosedError", st->EngineClosedError) < 0)
        return -1;
    struct {
        const char *name;
        long value;
    } constants[] = {
        {"EV_STARTED", EV_STARTED},
        {"EV_TEXT", EV_TEXT},
        {"EV_IMAGE", EV_IMAGE},
        {"EV_NOTIFY", EV_NOTIFY},
        {"EV_TOOL_CALL", EV_TOOL_CALL},
        {"EV_STORE", EV_STORE},
        {"EV_YIELD", EV_YIELD},
        {"EV_TIMER_SET", EV_TIMER_SET},
        {"EV_TIMER_CLEAR", EV_TIMER_CLEAR},
        {"EV_FINISHED", EV_FINISHED},
        {"EV_IDLE", EV_IDLE},
        {"OUTCOME_OK", OUTCOME_OK},
        {"OUTCOME_ERROR", OUTCOME_ERROR},
        {"OUTCOME_INTERRUPTED", OUTCOME_INTERRUPTED},
        {"OUTCOME_CPU_LIMIT", OUTCOME_CPU_LIMIT},
        {"FINISHED_CPU_SHIFT", FINISHED_CPU_SHIFT},
        {"MAX_STACK_LIMIT", (long)(WORKER_STACK_SIZE - STACK_MARGIN)},
        {"DEFAULT_STACK_LIMIT", (long)DEFAULT_JS_STACK},
    };
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++)
        if (PyModule_AddIntConstant(module, constants[i].name, constants[i].value) < 0)
            return -1;
    if (PyModule_AddStringConstant(module, "QUICKJS_VERSION", JS_GetVersion()) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *st = get_state(module);
    Py_VISIT(st->EngineType);
    Py_VISIT(st->CellType);
    Py_VISIT(st->EngineClosedError);
    return 0;
}

static int module_clear(PyObject *module)
{
    module_state *st = get_state(module);
    Py_CLEAR(st->EngineType);
    Py_CLEAR(st->CellType);
    Py_CLEAR(st->EngineClosedError);
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef quickjs_module = {
    PyModuleDef_HEAD_INIT,
    "codemode_host._quickjs",
    "The QuickJS-ng engine binding of codemode: worker threads, cells and their events.",
    sizeof(module_state),
    NULL,
    module_slots,
    module_traverse,
    module_clear,
    NULL,
};

PyMODINIT_FUNC PyInit__quickjs(void)
{
    return PyModuleDef_Init(&quickjs_module);
}
