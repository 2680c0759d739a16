/* The client's internals, shared by the files of src/core. */
#ifndef CUBE_CORE_CLIENT_INTERNAL_H
#define CUBE_CORE_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/error.h"
#include "base/mutex.h"
#include "cubert/backend/errors.h"
#include "cubert/backend/comm.h"
#include "cubert/backend/server.h"
#include "cubert/cubert.h"

/* An allocation: device memory plus its failure record. Reference counted
 * by the handles (and in-flight operations) that name it. */
typedef struct core_alloc {
    atomic_uint refs; /* one per live slot naming it, plus pins */
    cube_storage storage;
    struct core_stream *stream; /* the stream whose memory it came from */
    /* Made in a dry run: no storage until first real use. Cleared under
     * defer_lock; read without it to skip the lock in the common case. */
    atomic_int deferred;
    /* NULL when trusted. Written under failure_lock; read without it only
     * to test for NULL (the common case: no lock on the launch path). */
    _Atomic(cube_error *) failure;
    /* Memory cubert did not allocate (cube_wrap_memory): given back to its
     * owner through `release`, never to a pool. Set before publishing. */
    int foreign;
    /* Its id in the memory trace (memory_trace.h); 0: not recorded. */
    uint64_t trace_id;
    void (*release)(void *user);
    void *release_user;
    /* The first handle's bits: the trace's alloc and release events and
     * cube_memory_snapshot name the buffer by it. Set before the first
     * handle is published; never changes. */
    uint64_t first_handle;
    /* The cube_memory_snapshot that listed it last (snapshot.c), so a
     * buffer and its slices are listed once; under snapshot_lock. */
    uint64_t listed;
    /* cube_handle_set_label's copy, or NULL. Written under the labels'
     * lock (handles.c), read through core_buffer_name. */
    char *label;
} core_alloc;

/* The buffer name in messages and the trace: the handle's hex bits, and
 * the label in quotes after it when the buffer has one. */
#define CORE_BUFFER_NAME_MAX 96
void core_buffer_name(const core_alloc *a, uint64_t bits,
                      char out[CORE_BUFFER_NAME_MAX]);
/* The label alone into out ("" without one). */
void core_buffer_label(const core_alloc *a, char out[CUBE_LABEL_MAX + 1]);

/* A handle's slot in the table. `state` packs the generation (high 32
 * bits) and the handle's reference count (low 32 bits), so a lookup can
 * check and pin a slot with one compare-and-swap, without the table lock.
 * alloc/offset/size are written before the state publishes the slot and do
 * not change while its count is above zero. */
typedef struct core_slot {
    /* A cache line each: threads pinning their own handles must not
     * contend on a neighbour's. */
    _Alignas(64) _Atomic uint64_t state;
    core_alloc *alloc;
    uint64_t offset, size;
    uint32_t next_free; /* under handles_lock, while the slot is free */
} core_slot;

/* A resolved handle, holding a reference on its allocation until
 * core_resolved_drop. */
typedef struct core_resolved {
    cube_handle handle;
    core_alloc *alloc;
    uint64_t offset, size;
    /* The handle's slot, pinned until core_resolved_drop: the pin keeps
     * the slot, and through it the allocation, alive (one atomic to take,
     * one to give back, where a reference on the allocation would add two
     * more). */
    struct core_slot *slot;
    uint32_t slot_index;
} core_resolved;

/* An open profiling window. */
typedef struct core_window {
    uint64_t token;         /* the caller's: unique in the process */
    uint64_t backend_token; /* what the backend's start_profile gave */
    uint64_t busy_at_start; /* the stream's busy_ns (host-clock timing) */
    uint64_t launches_at_start;
    uint64_t failures_at_start;
    uint64_t client_serial; /* the client that opened it */
} core_window;

typedef struct core_graph core_graph;

/* A stream and its state. `base` is what backends see (id, index, memory
 * manager, their own state); it is set once at creation. Every other field
 * is under `lock`, which also serializes the backend calls of the
 * stream. */
typedef struct core_stream {
    cube_server_stream base;
    cube_mutex lock;
    /* cube_graph_prepare called, capture not begun */
    int prepared CUBE_GUARDED_FIELD(lock);
    /* the graph being recorded, or NULL, and the client recording it
     * (work of other clients on the stream is refused meanwhile) */
    core_graph *capture CUBE_GUARDED_FIELD(lock);
    struct cube_client *capture_client CUBE_GUARDED_FIELD(lock);
    /* open profiling windows */
    core_window *windows CUBE_GUARDED_FIELD(lock);
    size_t window_count CUBE_GUARDED_FIELD(lock);
    size_t window_cap CUBE_GUARDED_FIELD(lock);
    /* cube_allocation_mode_set */
    cube_allocation_mode alloc_mode CUBE_GUARDED_FIELD(lock);
    /* open persistent windows */
    uint32_t persistent_depth CUBE_GUARDED_FIELD(lock);
    /* what the memory manager was last told */
    int persistent_sent CUBE_GUARDED_FIELD(lock);
    /* dispatches run on this stream */
    uint64_t launches CUBE_GUARDED_FIELD(lock);
    /* launches, writes, replays that failed, and the latest of them */
    uint64_t failures CUBE_GUARDED_FIELD(lock);
    cube_error *last_failure CUBE_GUARDED_FIELD(lock);
} core_stream;

typedef struct core_cache_entry {
    uint64_t key;
    const cube_kernel *kernel; /* retained, to tell collisions apart */
    uint32_t mode;
    cube_compiled compiled;
    /* 1: compiled; 0: a thread compiles it; -1: that compile failed.
     * A failed entry stays in its list, skipped by lookups, until the
     * next launch of its kernel sets it back to 0 (under cache_lock) and
     * compiles into it; entries are never unlinked before close, so a
     * reader without the lock never meets a freed one. 1 is final. */
    atomic_int state;
    /* Per-kernel statistics, kept when the client's stats are on. */
    atomic_uint_fast64_t launches, total_ns;
    struct core_cache_entry *next; /* set before the entry is published */
} core_cache_entry;

#define CORE_CACHE_BUCKETS 256
/* Public calls in flight, counted per shard so threads on shards of their
 * own never share a cache line; the top bit of every shard says the
 * client is closing (calls.c). */
#define CORE_CALL_SHARDS 64
#define CORE_CALLS_CLOSING 0x80000000u
typedef struct core_call_shard {
    atomic_uint n;
    unsigned char pad[64 - sizeof(atomic_uint)]; /* a cache line each */
} core_call_shard;
#define CORE_CHUNK_SLOTS 4096u
#define CORE_MAX_CHUNKS 16384u /* 67,108,864 handles */
/* Handle bits: tag (12) | generation (26) | slot index (26). */
#define CORE_HANDLE_TAG_SHIFT 52
#define CORE_HANDLE_GEN_SHIFT 26
#define CORE_HANDLE_GEN_MAX ((1u << 26) - 1u)
#define CORE_HANDLE_INDEX_MASK ((1u << 26) - 1u)
#define CORE_MAX_CLIENTS CUBE_MAX_CLIENTS /* one tag each; tag 0 unused */
#define CORE_STREAM_CHUNK 256u
#define CORE_STREAM_CHUNKS 256u /* CUBE_MAX_STREAMS + 1 pointers */

/* A device open in this process: its server and what every client of it
 * shares (the server's pools and streams, the compiled-kernel cache, the
 * device fault). One per device per process (device.c), reference counted
 * by the clients open on it and freed when the last one closes. The
 * fields from `server` to `props` do not change after the open; every
 * other field is under the lock its comment names or atomic. */
typedef struct core_device {
    const cube_backend *backend;
    uint32_t index;
    char name[48];       /* "cuda:0" */
    cube_server *server; /* owned */
    const cube_server_vtable *vt;
    cube_properties props;
    /* The options the server was opened with, as asked (after the
     * configuration's defaults): a later open of the device that asks for
     * others is refused. cpu_threads 0: the backend's default. */
    uint32_t cpu_threads;
    char *cache_dir; /* NULL: not asked; "" disables */
    /* Clients open on the device; under the registry's lock. */
    uint32_t clients;
    struct core_device *next; /* the registry's list */

    cube_mutex fault_lock;
    atomic_int faulted;
    cube_error *fault CUBE_GUARDED_FIELD(fault_lock);

    /* Streams: chunks of pointers that never move, filled in order, so a
     * stream is found by index without a lock; streams_lock guards
     * creating one (and the layout new streams get). */
    cube_mutex streams_lock;
    _Atomic(core_stream **) stream_chunks[CORE_STREAM_CHUNKS];
    atomic_uint stream_count;
    /* what new streams get, when has_layout */
    cube_memory_layout layout CUBE_GUARDED_FIELD(streams_lock);
    int has_layout CUBE_GUARDED_FIELD(streams_lock);

    cube_mutex cache_lock;
    pthread_cond_t cache_cv; /* a compile finished */
    /* Buckets are pushed to under cache_lock and read without it. */
    _Atomic(core_cache_entry *) cache[CORE_CACHE_BUCKETS];
    atomic_size_t cache_entries; /* entries in the buckets */
    int stats; /* time every launch for the summary at the last close */
} core_device;

/* A client: one user's view of a device. What it holds alone: its
 * handles (and through them its buffers and their failures), its dry-run
 * scopes, the profiling windows and graph captures it opened, its graphs,
 * its staging buffers and the streams its threads chose. Everything else
 * is the device's. `server`, `vt` and `props` are the device's, copied
 * for the hot paths; `comm` is the backend's (NULL: no collectives),
 * copied for the communicators made on the client. */
struct cube_client {
    core_device *dev;
    cube_server *server;
    const cube_server_vtable *vt;
    const cube_comm_vtable *comm;
    uint64_t serial; /* process-unique, never reused */
    /* 12 bits in every handle of this client, held by no other open
     * client (handles.c) */
    uint32_t tag;
    cube_properties props;
    char device[48];

    /* The handle table: chunks of slots that never move (a fixed array of
     * chunk pointers, filled in as needed), so lookups take no lock;
     * handles_lock guards creating slots and the free list. */
    cube_mutex handles_lock;
    _Atomic(core_slot *) *chunks; /* CORE_MAX_CHUNKS entries */
    atomic_uint slot_count;       /* slots ever used */
    /* The slot released last, kept out of the free list so the next
     * allocation takes it back with one exchange instead of the lock;
     * UINT32_MAX: none. */
    _Atomic uint32_t hot_slot;
    /* Per slot index below gen_start_count, the first generation this
     * client may issue there, left by the clients that held its tag
     * before (0: none left, the index is skipped); set at open. */
    const uint32_t *gen_start;
    uint32_t gen_start_count;
    /* FIFO of free slots, UINT32_MAX: none */
    uint32_t free_head CUBE_GUARDED_FIELD(handles_lock);
    uint32_t free_tail CUBE_GUARDED_FIELD(handles_lock);

    cube_mutex defer_lock; /* backs deferred allocations, once */

    /* Serializes cube_memory_snapshot (its walk marks each buffer it
     * lists with the walk's number); taken before defer_lock. */
    cube_mutex snapshot_lock;
    uint64_t snapshot_serial CUBE_GUARDED_FIELD(snapshot_lock);

    /* Wrapped memory alive (cube_wrap_memory), for cube_memory_usage. */
    atomic_uint_fast64_t foreign_buffers, foreign_bytes;

    /* Guards the failures of this client's allocations. */
    cube_mutex failure_lock;

    cube_mutex staging_lock;
    void **staging CUBE_GUARDED_FIELD(staging_lock);
    size_t staging_count CUBE_GUARDED_FIELD(staging_lock);
    size_t staging_cap CUBE_GUARDED_FIELD(staging_lock);

    cube_mutex graphs_lock;
    core_graph *graphs CUBE_GUARDED_FIELD(graphs_lock); /* live, a list */

    /* Calls of communicators between processes this client's buffers
     * wait on, which the backend follows on the device (comm.c). */
    atomic_uint comm_inflight;

    /* Futures not yet waited on, a list (transfer.c): close completes
     * and detaches them before it tears anything down. */
    cube_mutex futures_lock;
    struct cube_future *futures CUBE_GUARDED_FIELD(futures_lock);

    /* The ranges its threads opened (range.c): one stack per thread,
     * a list. The lock guards the list; a stack is its thread's alone
     * (and close's, once no call is in flight). */
    cube_mutex ranges_lock;
    struct core_range_stack *ranges CUBE_GUARDED_FIELD(ranges_lock);
    atomic_uint ranges_open; /* levels open over every stack */

    int stats;         /* time every launch for the summary at close */
    int bounds_always; /* every launch bounds-checked (configuration) */

    /* Public calls in flight (calls.c). cube_client_close sets
     * CORE_CALLS_CLOSING in every shard, then waits for the counts to
     * drain. Apart from the struct's other fields by a line of padding,
     * since every call writes one of them. */
    unsigned char calls_pad_[64];
    core_call_shard calls[CORE_CALL_SHARDS];
    /* Called by cube_client_close once later calls are refused and before
     * it waits for those in flight (tests set it to act in that window);
     * NULL: none. */
    void (*closing_hook)(void *arg);
    void *closing_hook_arg;
};

/* --- device.c --- */
/* The device `backend`:`index` opened with `opts` (defaults applied, as
 * cube_client_open resolved them; explicit: which of its fields the caller
 * set), one more client on it. Opens the server when no client has it
 * open. Errors: CUBE_ERR_INVALID_ARGUMENT (the device is open with other
 * options), what the backend's open and properties return. */
cube_error *core_device_acquire(const cube_backend *backend, uint32_t index,
                                const cube_client_options *opts,
                                const cube_client_options *asked,
                                core_device **out);
/* Splits "name" or "name:index", finds the backend and checks the index
 * against its device count; `fn` names the public call in messages.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (malformed), CUBE_ERR_NOT_FOUND (no
 * such backend or index), CUBE_ERR_UNAVAILABLE (left out of the build, or
 * the backend's device_count says why not). */
cube_error *core_device_parse(const char *device, const char *fn,
                              const cube_backend **backend, uint32_t *index);
/* One client less; the last one closes the device (every stream drained
 * and closed, the kernel cache freed, the server destroyed). */
void core_device_release(core_device *d);

/* --- handles.c --- */
/* The handle table and the client's tag; needs c->serial. On error
 * nothing is left to destroy. Errors: CUBE_ERR_OUT_OF_MEMORY,
 * CUBE_ERR_RESOURCE_LIMIT (every tag is held by an open client). */
cube_error *core_handles_init(cube_client *c);
void core_handles_destroy(cube_client *c);
/* Whether the client with `serial` (whose tag was `tag`) is still open:
 * serials are never reused. Lock-free. */
int core_client_is_open(uint32_t tag, uint64_t serial);
/* An entry of a table a thread keeps per client (its dry-run scopes, the
 * streams it chose with cube_stream_use): the client, by serial (0: a free
 * entry) and tag, and what the table keeps for it. */
typedef struct core_client_entry {
    uint64_t client_serial;
    uint32_t client_tag;
    uint64_t value;
} core_client_entry;
/* Gives `c` an entry of `t` (n entries, *used of them taken) holding
 * `value`: a free one, else one whose client has closed since (given back
 * first). Returns its index, or -1 when every entry is an open client's.
 * Lock-free; the table is the calling thread's. */
int core_client_entry_take(core_client_entry *t, int n, int *used,
                           const cube_client *c, uint64_t value);

/* --- profile.c --- */
/* Whether the calling thread has a dry-run scope open on `c`. */
int core_dry_run_active(const cube_client *c);
/* Resolves and pins `h`. Errors: CUBE_ERR_NOT_FOUND (message names `what`). */
cube_error *core_resolve(cube_client *c, cube_handle h, const char *what,
                         core_resolved *out);
void core_resolved_drop(cube_client *c, core_resolved *r);
/* Calls `visit` once per live slot of `c`'s table, in slot order, with
 * the slot pinned (pin_slot's compare-and-swap) so a release on another
 * thread cannot free the allocation meanwhile; a slot being released is
 * passed over. Slices make several slots of one allocation. Takes no
 * lock; the last unpin may give memory back. */
void core_handles_walk(cube_client *c,
                       void (*visit)(cube_client *c, core_alloc *a, void *user),
                       void *user);
cube_binding core_binding(const core_resolved *r);
/* Backs `size` bytes for stream `st`: the backend's initialize_memory, or
 * the stream's manager. */
cube_error *core_storage_alloc(cube_client *c, core_stream *st, uint64_t size,
                               cube_storage *out);
/* Publishes foreign storage `st` (already accepted by the backend) as a
 * new handle of `c` on stream `s`, with its owner's release. Errors:
 * CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_RESOURCE_LIMIT (handle table full). */
cube_error *core_publish_foreign(cube_client *c, core_stream *s,
                                 const cube_storage *st,
                                 void (*release)(void *), void *user,
                                 cube_handle *out);
/* Backs every deferred allocation among `r` (made inside a dry run) now
 * that it is used for real. A failure is CUBE_ERR_STORAGE_MAPPING_FAILED,
 * recorded on that buffer too. */
cube_error *core_materialize(cube_client *c, const core_resolved *r, size_t n);

/* --- failure.c --- */
void core_failure_record(cube_client *c, core_alloc *a, const cube_error *err);
void core_failure_clear(cube_client *c, core_alloc *a);
/* A copy of the allocation's failure, or NULL when it is trusted. */
cube_error *core_failure_get(cube_client *c, core_alloc *a);
/* CUBE_ERR_SEVERAL naming each failed buffer among `r`, or NULL. */
cube_error *core_failure_claim_check(cube_client *c, const core_resolved *r,
                                     size_t n, const char *operation);
/* A copy of the device fault, or NULL. */
cube_error *core_fault_get(cube_client *c);
/* Makes `err` the client's terminal fault when it is a device fault. */
void core_fault_note(cube_client *c, const cube_error *err);

/* Pins an allocation for as long as a graph needs it (a reference). */
void core_alloc_pin(cube_client *c, core_alloc *a);
void core_alloc_unpin(cube_client *c, core_alloc *a);

/* --- ranges (range.c) --- */
/* Ends the ranges still open on `c` (in the trace) and frees its stacks;
 * cube_client_close, once no call is in flight. */
void core_ranges_close(cube_client *c);

/* --- streams (stream.c) --- */
/* The calling thread's own stream id (the one it uses unless
 * cube_stream_use chose another): its track in the trace. */
cube_stream_id core_stream_own(void);
/* The calling thread's stream (created on first use), not locked.
 * Errors: CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_RESOURCE_LIMIT (more than
 * CUBE_MAX_STREAMS streams), what the backend's stream_open returns. */
cube_error *core_stream_get(cube_client *c, core_stream **out);
/* The stream `id` when it exists, else NULL (never creates one). */
core_stream *core_stream_find(core_device *d, cube_stream_id id);
/* The stream at `index`, or NULL. Lock-free. */
core_stream *core_stream_at(const core_device *d, uint32_t index);
/* Closes every stream: memory managers first, then the backend's side
 * (the device's last close, after every stream drained). */
void core_streams_destroy(core_device *d);
/* Takes and drops the stream's lock, which serializes the calls that
 * issue work on it (see the lock order in docs/threading.md). */
void core_stream_lock(core_stream *s) CUBE_ACQUIRE(s->lock);
void core_stream_unlock(core_stream *s) CUBE_RELEASE(s->lock);
/* CUBE_ERR_GRAPH_STATE when `s` is capturing (for operations a capture
 * cannot record), else NULL. Call with the stream entered. */
cube_error *core_stream_refuse_in_capture(const core_stream *s,
                                          const char *operation)
    CUBE_REQUIRES(s->lock);
/* core_stream_get, then the stream locked: NULL with *out entered, or
 * core_stream_get's error with nothing held (a NULL error is success,
 * hence the 0). */
cube_error *core_stream_enter(cube_client *c, core_stream **out)
    CUBE_TRY_ACQUIRE(0, (*out)->lock);
/* core_stream_enter where a thread without a stream has nothing to do
 * (no window to note or end a thing in): 1 with *out entered, else 0,
 * core_stream_get's error dropped with `why`. */
int core_stream_enter_or_drop(cube_client *c, const char *why,
                              core_stream **out)
    CUBE_TRY_ACQUIRE(1, (*out)->lock);
/* core_stream_enter for an operation a capture cannot record: a capturing
 * stream is left again and refused (core_stream_refuse_in_capture's
 * error). */
cube_error *core_stream_enter_uncaptured(cube_client *c, const char *operation,
                                         core_stream **out)
    CUBE_TRY_ACQUIRE(0, (*out)->lock);
/* Counts a failure of work on `s` for its profiling windows. Call with the
 * stream entered. */
void core_stream_note_failure(core_stream *s, const cube_error *err)
    CUBE_REQUIRES(s->lock);
/* Drops profiling window `i` of the stream (the backend's token is the
 * caller's to end or abandon first). Call with the stream entered. */
void core_stream_window_remove(core_stream *s, size_t i) CUBE_REQUIRES(s->lock);
/* The same, entering the stream itself. */
void core_stream_note_failure_now(cube_client *c, const cube_error *err);

/* --- memory.c --- */
/* Tells the backend whether the stream's allocations are persistent now
 * (its mode, a persistent window, a graph being prepared) when that
 * changed. Call with the stream entered. */
cube_error *core_stream_sync_persistent(cube_client *c, core_stream *s)
    CUBE_REQUIRES(s->lock);
/* The checks of a memory query's versioned struct and scope:
 * CUBE_ERR_INVALID_ARGUMENT when `field` (the struct's struct_size, as
 * the caller names it; NULL where no struct is filled) is below
 * `min_size` (sizeof(`type`) of the first version), or when `scope` is no
 * cube_memory_scope; else NULL. */
cube_error *core_memory_query_check(const char *fn, cube_memory_scope scope,
                                    const char *field, uint32_t struct_size,
                                    uint32_t min_size, const char *type);

/* --- comm.c: collectives recorded in graphs --- */
/* A collective recorded in a graph: the rank's call as the backend gets
 * it, its destination (pinned by the graph; NULL when it has none), and
 * the group it was issued in (calls of one cube_group_end share a nonzero
 * tag, and are recorded one after the other; 0: alone). */
typedef struct core_recorded_call {
    cube_comm *comm;
    cube_collective call;
    core_alloc *dst;
    uint64_t group;
} core_recorded_call;
/* Keeps the communicator's group (and its ranks) alive past their
 * destroy for a graph that names it; release drops that. `hardware`: the
 * backend's graph holds the rank's own device work (NCCL kernels), so the
 * backend's communicator of that rank outlives its destroy too, until
 * the last such graph goes. */
void core_comm_hold(cube_comm *comm, int hardware);
void core_comm_release(cube_comm *comm, int hardware);
/* Re-issues the `n` recorded calls of one group (or a lone call, n 1)
 * through the rendezvous, as calls: posted together and run as
 * cube_group_end runs them, meeting the peers' calls (their replays);
 * calls[i] lie `stride` bytes apart (graph entries). `refusal` (taken;
 * NULL to run) is posted as this rank's refusal so that the peers answer
 * an error rather than wait. `agree_only`: a hardware graph's calls only
 * meet the peers' and answer whether every rank agreed, issuing nothing
 * (the backend's graph holds them). The failure store is the caller's,
 * except that a call between processes the backend follows on the device
 * marks its recorded destination should it fail there later. Call
 * without the stream entered. */
cube_error *core_comm_replay_calls(const core_recorded_call *calls, size_t n,
                                   size_t stride, cube_error *refusal,
                                   int agree_only);
/* Settles what the backend learned of the client's calls between
 * processes that it follows on the device: a failed one's destination
 * records the failure. Never blocks on the device; cheap when nothing is
 * followed. Returns how many failed. Call with no stream entered. */
size_t core_comm_reap(cube_client *c);
/* Whether the communicator is between processes (cube_comm_init_rank). */
int core_comm_remote(const cube_comm *comm);
/* A hardware graph holding calls of a communicator between processes:
 * its replays are followed on the device as a call is. Begin (before the
 * launch) refuses a destroyed communicator (CUBE_ERR_NOT_FOUND) or an
 * aborted one (CUBE_ERR_ABORTED), holds it in the backend and starts
 * following; `writes` (copied) are the buffers a failure marks. End
 * (after the launch, `launched` 0 when it did not happen) lets it go and
 * follows the replay until it ends: a failure there (the timeout, an
 * abort) is recorded on every buffer of `writes`. Call both with the
 * stream entered; end frees the watch, also when it fails. */
typedef struct core_replay_watch core_replay_watch;
cube_error *core_comm_replay_begin(cube_comm *comm, core_stream *st,
                                   core_alloc *const *writes, size_t nwrites,
                                   core_replay_watch **out)
    CUBE_REQUIRES(st->lock);
cube_error *core_comm_replay_end(core_replay_watch *w, core_stream *st,
                                 int launched) CUBE_REQUIRES(st->lock);

/* --- graph.c --- */
/* Records a validated dispatch into the stream's capture. `written` and
 * `cleared` list the allocations the launch writes (OUT and INOUT) and
 * fully rewrites (OUT); `read` those it reads. Call with the stream
 * entered. */
cube_error *core_graph_record(cube_client *c, core_stream *s,
                              const cube_dispatch *d, core_alloc *const *read,
                              size_t nread, core_alloc *const *written,
                              size_t nwritten, core_alloc *const *cleared,
                              size_t ncleared);
/* Records a collective all ranks agreed on in the stream's capture: the
 * call as the backend gets it (bindings resolved), its source and
 * destination (either may be NULL), and whether the destination is the
 * whole buffer. `hardware`: the backend captured the call itself (its
 * replay runs it; the entry is for the rendezvous and the failure
 * store). `group`: the tag of the group it was issued in, or 0
 * (core_recorded_call). Holds the communicator until the graph goes.
 * Call with the stream entered. */
cube_error *core_graph_record_collective(cube_client *c, core_stream *s,
                                         cube_comm *comm,
                                         const cube_collective *call,
                                         core_alloc *src, core_alloc *dst,
                                         int dst_whole, int hardware,
                                         uint64_t group) CUBE_REQUIRES(s->lock);
/* Frees a capture that never ended (stream teardown). */
void core_graph_abort(cube_client *c, core_graph *g);
void core_graphs_destroy(cube_client *c);

/* --- kernel.c --- */
/* Whether two kernel objects are the same kernel: format, name, code,
 * cube dimension and, for raw kernels, options and declared parameters
 * (the cache compares in full, so a hash collision never runs the wrong
 * kernel). */
int core_kernel_same(const cube_kernel *a, const cube_kernel *b);

/* --- launch.c --- */
void core_cache_destroy(core_device *d);
/* How many entries the compiled-kernel cache holds, failed ones included
 * (one per kernel and compile mode launched). Lock-free. */
size_t core_cache_entry_count(const cube_client *c);
/* Logs the per-kernel summary table (when stats were on). */
void core_cache_log_summary(core_device *d);

/* --- transfer.c --- */
void core_staging_destroy(cube_client *c);
/* Completes every read whose future was not waited on yet (waiting for it
 * and dropping its pins) and detaches the future from the client: a later
 * cube_future_wait answers the read's result without touching the client.
 * Waits for a cube_future_wait running on another thread. Client close,
 * after the calls in flight drained, before anything is torn down. */
void core_futures_detach(cube_client *c);

/* --- config.c --- */
typedef struct core_config {
    uint32_t cpu_threads;
    char cache_dir[1024]; /* "" with cache_dir_set: disabled */
    int cache_dir_set;
    char device[64];
} core_config;
/* Reads CUBERT_* once (first call) and applies the log settings. */
const core_config *core_config_get(void);

/* --- registry.c --- */
const cube_backend *core_backend_find(const char *name);
const cube_backend *const *core_backends(void);
/* 1 when `name` is a backend of the project that this build left out. */
int core_backend_left_out(const char *name);

/* --- calls.c --- */
/* The calling thread's shard, plus one (0: not chosen yet). */
extern _Thread_local uint32_t core_thread_call_shard;
/* Chooses the calling thread's shard (round robin over the threads that
 * ever called) and returns it plus one. */
uint32_t core_call_shard_choose(void);
/* Counts a public call on `c` in flight: the shard to hand to
 * core_call_leave when the call is done, or NULL when cube_client_close
 * has begun (the call must then touch nothing of the client; answer
 * core_call_refused). One atomic increment on the thread's own shard. */
static inline core_call_shard *core_call_enter(cube_client *c)
{
    uint32_t s = core_thread_call_shard;
    if (!s)
        s = core_call_shard_choose();
    core_call_shard *sh = &c->calls[s - 1];
    if (atomic_fetch_add_explicit(&sh->n, 1, memory_order_acquire) &
        CORE_CALLS_CLOSING) {
        atomic_fetch_sub_explicit(&sh->n, 1, memory_order_release);
        return NULL;
    }
    return sh;
}
/* The call counted by core_call_enter is done: it touches nothing of the
 * client after this. */
static inline void core_call_leave(core_call_shard *sh)
{
    atomic_fetch_sub_explicit(&sh->n, 1, memory_order_release);
}
/* CUBE_ERR_INVALID_ARGUMENT: `fn` was called after cube_client_close
 * began. Reads nothing of the client. */
cube_error *core_call_refused(const char *fn);
/* Refuses every public call that starts from now on, runs the closing
 * hook, then waits until none is in flight (cube_client_close). */
void core_calls_close(cube_client *c);

/* The body of public call `fn` on client `c` whose work is `call` (an
 * expression of type cube_error *): counted in flight around it, refused
 * once the client is closing. A NULL client goes straight to `call`,
 * which answers it with its own message. */
#define CORE_CALL(c, fn, call)                                                 \
    do {                                                                       \
        if (!(c))                                                              \
            return (call);                                                     \
        core_call_shard *core_call_ = core_call_enter(c);                      \
        if (!core_call_)                                                       \
            return core_call_refused(fn);                                      \
        cube_error *core_call_err_ = (call);                                   \
        core_call_leave(core_call_);                                           \
        return core_call_err_;                                                 \
    } while (0)

#define CORE_CHECK_CLIENT(c, fn)                                               \
    do {                                                                       \
        if (!(c))                                                              \
            return cube_error_null_argument(fn, "client");                     \
        if (atomic_load_explicit(&(c)->dev->faulted, memory_order_acquire))    \
            return core_fault_get(c);                                          \
    } while (0)

/* CORE_CHECK_CLIENT, then the out parameter `out` (of a call that answers
 * through it) checked. */
#define CORE_CHECK_CLIENT_OUT(c, out, fn)                                      \
    do {                                                                       \
        CORE_CHECK_CLIENT(c, fn);                                              \
        if (!(out))                                                            \
            return cube_error_null_argument(fn, "out");                        \
    } while (0)

#endif /* CUBE_CORE_CLIENT_INTERNAL_H */
