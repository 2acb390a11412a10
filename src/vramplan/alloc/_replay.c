/*
 * vramplan.alloc._replay: the default caching-allocator replay of a compact event stream, in C.
 *
 * The fast path of the model whose reference is vramplan/alloc/caching.py CachingAllocator, for
 * PyTorch's default PYTORCH_CUDA_ALLOC_CONF; both follow c10/cuda/CUDACachingAllocator.cpp:
 *   - round_size: requests round up to a multiple of kMinBlockSize;
 *   - pools (get_pool): rounded requests of at most kSmallSize use the small pool, others the large;
 *   - best fit (get_free_block): the cached block of the smallest size >= the request, the lowest
 *     address among equal sizes (BlockComparatorSize orders blocks by (size, address));
 *   - should_split: small pool when >= kMinBlockSize would be left, large pool when > kSmallSize;
 *   - get_allocation_size: kSmallBuffer segments for small requests, kLargeBuffer for large requests
 *     under kMinLargeAlloc, otherwise the request rounded up to kRoundLarge;
 *   - free (free_block, try_merge_blocks): the block merges with cached neighbours in its segment
 *     and is cached;
 *   - under a capacity, a segment that does not fit releases every cached block that is a whole
 *     segment (release_cached_blocks) and retries once; if it still does not fit, out of memory.
 * Addresses are modelled (segments from ADDRESS_BASE on, each at the previous end rounded up to
 * SEGMENT_ALIGN) because best fit breaks ties by address.
 *
 * This file holds no number of the allocator: vramplan/alloc/rules.py is their only home, and
 * vramplan/alloc/native.py passes them to configure() when it imports this module; replay() refuses
 * to run before that.  tests/test_alloc_native.py checks this module against CachingAllocator on
 * random programs, on runs of repeated windows and on the analytic engine's streams, statistic by
 * statistic.
 *
 * Exported:
 *   configure(*, min_block_size, small_size, small_buffer, large_buffer, min_large_alloc,
 *             round_large, segment_align, address_base) -> None   (rules.py's values)
 *   rules() -> dict of those values, or None before configure()
 *   replay(parts, capacity_bytes) -> tuple
 * parts: a sequence of parts replayed in order, each a list of ints (n > 0 allocates n bytes as the
 * next block id, n < 0 frees block -n - 1, 0 is ignored) or a tuple (events, strides, count) for
 * count windows, window w being events[k] - w * strides[k] (compact.Repeat); capacity_bytes: an
 * int, or -1 for no capacity.  The tuple's fields are named in vramplan/alloc/native.py (FIELDS).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the allocator's rules, as rules.py names them (K_MIN_BLOCK_SIZE ...), set once by configure() */
typedef struct {
    int64_t min_block_size, small_size, small_buffer, large_buffer, min_large_alloc, round_large;
    int64_t segment_align, address_base;
} Rules;

static Rules R;
static int configured = 0;

typedef struct {
    int64_t addr, size, req;  /* req: requested bytes, 0 for a cached block */
    int32_t prev, next;       /* neighbours in the segment, -1 for none */
    int32_t small;            /* pool */
} Block;

typedef struct {               /* a cached block's key: (size, addr) order, then its index */
    int64_t size, addr;
    int32_t block;
} Key;

typedef struct {
    Key *a;
    Py_ssize_t n, cap;
} Pool;

typedef struct {
    Block *blocks;
    Py_ssize_t nblocks, blocks_cap;
    int32_t *spare;            /* indices of blocks merged away, for reuse */
    Py_ssize_t nspare, spare_cap;
    int32_t *live;             /* block id -> block index, -1 once freed */
    Py_ssize_t nlive, live_cap;
    Pool small, large;
    int64_t capacity;          /* -1: none */
    int64_t next_addr, allocated, reserved, requested;
    int64_t peak_allocated, peak_reserved, peak_requested;
    int64_t segments, peak_segments, num_device_alloc, num_device_free, num_alloc_retries;
    int64_t num_allocs, num_frees, unmatched;
    int64_t allocated_at_peak_reserved, largest_free_at_peak_reserved;
    int oom;
    int64_t oom_index, oom_block_id, oom_requested, oom_rounded, oom_device_request, oom_allocated,
        oom_reserved, oom_reserved_before, oom_released, oom_largest_free;
} State;

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap)
        return 0;
    Py_ssize_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, (size_t)c * item);
    if (q == NULL)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

static inline int key_less(int64_t s1, int64_t a1, int64_t s2, int64_t a2) {
    return s1 < s2 || (s1 == s2 && a1 < a2);
}

/* first position whose key is >= (size, addr) */
static inline Py_ssize_t lower_bound(const Pool *p, int64_t size, int64_t addr) {
    Py_ssize_t lo = 0, hi = p->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        if (key_less(p->a[mid].size, p->a[mid].addr, size, addr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int pool_insert(Pool *p, int64_t size, int64_t addr, int32_t block) {
    if (grow((void **)&p->a, &p->cap, p->n + 1, sizeof(Key)) < 0)
        return -1;
    Py_ssize_t i = lower_bound(p, size, addr);
    memmove(p->a + i + 1, p->a + i, (size_t)(p->n - i) * sizeof(Key));
    p->a[i].size = size;
    p->a[i].addr = addr;
    p->a[i].block = block;
    p->n++;
    return 0;
}

static inline void pool_remove_at(Pool *p, Py_ssize_t i) {
    memmove(p->a + i, p->a + i + 1, (size_t)(p->n - i - 1) * sizeof(Key));
    p->n--;
}

static inline void pool_remove(Pool *p, int64_t size, int64_t addr) {
    pool_remove_at(p, lower_bound(p, size, addr));
}

static int64_t largest_free(const State *s) {
    int64_t a = s->small.n ? s->small.a[s->small.n - 1].size : 0;
    int64_t b = s->large.n ? s->large.a[s->large.n - 1].size : 0;
    return a > b ? a : b;
}

static int32_t new_block(State *s) {
    if (s->nspare)
        return s->spare[--s->nspare];
    if (grow((void **)&s->blocks, &s->blocks_cap, s->nblocks + 1, sizeof(Block)) < 0)
        return -1;
    return (int32_t)s->nblocks++;
}

static int drop_block(State *s, int32_t b) {
    if (grow((void **)&s->spare, &s->spare_cap, s->nspare + 1, sizeof(int32_t)) < 0)
        return -1;
    s->spare[s->nspare++] = b;
    return 0;
}

/* release_cached_blocks: every cached block that is a whole segment is given back, large pool first */
static int64_t release_cached(State *s) {
    int64_t released = 0;
    Pool *pools[2] = {&s->large, &s->small};
    for (int k = 0; k < 2; k++) {
        Pool *p = pools[k];
        Py_ssize_t w = 0;
        for (Py_ssize_t i = 0; i < p->n; i++) {
            Block *b = &s->blocks[p->a[i].block];
            if (b->prev < 0 && b->next < 0) {
                released += b->size;
                s->num_device_free++;
                s->segments--;
                drop_block(s, p->a[i].block);
            } else {
                p->a[w++] = p->a[i];
            }
        }
        p->n = w;
    }
    s->reserved -= released;
    return released;
}

/* one event; returns 0, 1 when out of memory, -1 on a memory error (exception set) */
static int step(State *s, int64_t n, int64_t index) {
    if (n > 0) {
        /* round_size (n > 0, so never below min_block_size) */
        int64_t r = ((n + R.min_block_size - 1) / R.min_block_size) * R.min_block_size;
        int small = r <= R.small_size;
        Pool *pool = small ? &s->small : &s->large;
        Py_ssize_t i = lower_bound(pool, r, INT64_MIN);
        int32_t bi;
        int moved = 0;
        if (i == pool->n) {
            /* get_allocation_size */
            int64_t size = small ? R.small_buffer
                : (r < R.min_large_alloc ? R.large_buffer
                   : ((r + R.round_large - 1) / R.round_large) * R.round_large);
            if (s->capacity >= 0 && s->reserved + size > s->capacity) {
                int64_t before = s->reserved;
                int64_t released = release_cached(s);
                s->num_alloc_retries++;
                if (s->reserved + size > s->capacity) {
                    s->oom = 1;
                    s->oom_index = index;
                    s->oom_block_id = s->nlive;
                    s->oom_requested = n;
                    s->oom_rounded = r;
                    s->oom_device_request = size;
                    s->oom_allocated = s->allocated;
                    s->oom_reserved = s->reserved;
                    s->oom_reserved_before = before;
                    s->oom_released = released;
                    s->oom_largest_free = largest_free(s);
                    return 1;
                }
            }
            bi = new_block(s);
            if (bi < 0)
                return -1;
            Block *b = &s->blocks[bi];
            b->addr = s->next_addr;
            b->size = size;
            b->req = 0;
            b->prev = b->next = -1;
            b->small = small;
            s->next_addr += ((size + R.segment_align - 1) / R.segment_align) * R.segment_align;
            s->segments++;
            if (s->segments > s->peak_segments)
                s->peak_segments = s->segments;
            s->num_device_alloc++;
            s->reserved += size;
            if (s->reserved > s->peak_reserved) {
                s->peak_reserved = s->reserved;
                moved = 1;
            }
        } else {
            bi = pool->a[i].block;
            pool_remove_at(pool, i);
        }
        int64_t rem = s->blocks[bi].size - r;
        int32_t out;
        /* should_split without expandable segments or max_split_size */
        if (small ? rem >= R.min_block_size : rem > R.small_size) {
            int32_t nb = new_block(s);   /* may move s->blocks */
            if (nb < 0)
                return -1;
            Block *b = &s->blocks[bi];
            Block *x = &s->blocks[nb];
            x->addr = b->addr;
            x->size = r;
            x->req = n;
            x->prev = b->prev;
            x->next = bi;
            x->small = small;
            if (b->prev >= 0)
                s->blocks[b->prev].next = nb;
            b->prev = nb;
            b->addr += r;
            b->size = rem;
            if (pool_insert(pool, rem, b->addr, bi) < 0)
                return -1;
            s->allocated += r;
            out = nb;
        } else {
            Block *b = &s->blocks[bi];
            b->req = n;
            s->allocated += b->size;
            out = bi;
        }
        s->requested += n;
        if (s->allocated > s->peak_allocated)
            s->peak_allocated = s->allocated;
        if (s->requested > s->peak_requested)
            s->peak_requested = s->requested;
        if (grow((void **)&s->live, &s->live_cap, s->nlive + 1, sizeof(int32_t)) < 0)
            return -1;
        s->live[s->nlive++] = out;
        s->num_allocs++;
        if (moved) {
            /* the peak of reserved bytes moved in this malloc: what is allocated and cached once the
               block is handed out */
            s->allocated_at_peak_reserved = s->allocated;
            s->largest_free_at_peak_reserved = largest_free(s);
        }
    } else if (n < 0) {
        int64_t j = -n - 1;
        if (j >= s->nlive || s->live[j] < 0) {
            s->unmatched++;
            return 0;
        }
        int32_t bi = s->live[j];
        s->live[j] = -1;
        Block *b = &s->blocks[bi];
        Pool *pool = b->small ? &s->small : &s->large;
        s->allocated -= b->size;
        s->requested -= b->req;
        b->req = 0;
        s->num_frees++;
        if (b->prev >= 0 && s->blocks[b->prev].req == 0) {
            int32_t pi = b->prev;
            Block *p = &s->blocks[pi];
            pool_remove(pool, p->size, p->addr);
            b->addr = p->addr;
            b->size += p->size;
            b->prev = p->prev;
            if (p->prev >= 0)
                s->blocks[p->prev].next = bi;
            if (drop_block(s, pi) < 0)
                return -1;
        }
        if (b->next >= 0 && s->blocks[b->next].req == 0) {
            int32_t ni = b->next;
            Block *x = &s->blocks[ni];
            pool_remove(pool, x->size, x->addr);
            b->size += x->size;
            b->next = x->next;
            if (x->next >= 0)
                s->blocks[x->next].prev = bi;
            if (drop_block(s, ni) < 0)
                return -1;
        }
        if (pool_insert(pool, b->size, b->addr, bi) < 0)
            return -1;
    }
    return 0;
}

static void state_free(State *s) {
    free(s->blocks);
    free(s->spare);
    free(s->live);
    free(s->small.a);
    free(s->large.a);
}

/* the ints of a sequence as int64 (a new array, or NULL with an exception set) */
static int64_t *as_int64(PyObject *obj, Py_ssize_t *len, const char *what) {
    PyObject *seq = PySequence_Fast(obj, what);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int64_t *out = (int64_t *)malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (out == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_OverflowError, "%s: item %zd does not fit in 64 bits", what, i);
            free(out);
            Py_DECREF(seq);
            return NULL;
        }
        out[i] = (int64_t)v;
    }
    Py_DECREF(seq);
    *len = n;
    return out;
}

/* replay one part: a list of events, or (events, strides, count): window w is events[k] - w * strides[k];
   returns 0, 1 when out of memory, -1 with an exception set */
static int run_part(State *s, PyObject *part, int64_t *index) {
    if (PyTuple_Check(part)) {
        PyObject *events_obj, *strides_obj;
        long long count;
        if (!PyArg_ParseTuple(part, "OOL:part", &events_obj, &strides_obj, &count))
            return -1;
        Py_ssize_t ne = 0, ns = 0;
        int64_t *ev = as_int64(events_obj, &ne, "a run's events must be ints");
        if (ev == NULL)
            return -1;
        int64_t *st = as_int64(strides_obj, &ns, "a run's strides must be ints");
        if (st == NULL) {
            free(ev);
            return -1;
        }
        if (ns != ne) {
            free(ev);
            free(st);
            PyErr_SetString(PyExc_ValueError, "a run has as many strides as events");
            return -1;
        }
        int rc = 0;
        for (long long w = 0; w < count && rc == 0; w++) {
            for (Py_ssize_t k = 0; k < ne; k++) {
                rc = step(s, ev[k] - (int64_t)w * st[k], (*index)++);
                if (rc != 0)
                    break;
            }
        }
        free(ev);
        free(st);
        if (rc < 0)
            PyErr_NoMemory();
        return rc;
    }
    Py_ssize_t n = 0;
    int64_t *ev = as_int64(part, &n, "events must be ints");
    if (ev == NULL)
        return -1;
    int rc = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        rc = step(s, ev[k], (*index)++);
        if (rc != 0)
            break;
    }
    free(ev);
    if (rc < 0)
        PyErr_NoMemory();
    return rc;
}

static PyObject *replay(PyObject *self, PyObject *args) {
    PyObject *parts;
    long long capacity;
    if (!PyArg_ParseTuple(args, "OL:replay", &parts, &capacity))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError,
                        "_replay.configure() was not called (vramplan.alloc.native passes rules.py's values)");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(parts, "parts must be a sequence");
    if (seq == NULL)
        return NULL;
    State s;
    memset(&s, 0, sizeof s);
    s.capacity = capacity < 0 ? -1 : (int64_t)capacity;
    s.next_addr = R.address_base;
    Py_ssize_t nparts = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int64_t index = 0;
    for (Py_ssize_t i = 0; i < nparts; i++) {
        int rc = run_part(&s, items[i], &index);
        if (rc < 0) {
            state_free(&s);
            Py_DECREF(seq);
            return NULL;
        }
        if (rc > 0)
            break;
    }
    Py_DECREF(seq);
    PyObject *oom;
    if (s.oom) {
        oom = Py_BuildValue("(LLLLLLLLLLL)", (long long)s.oom_index, (long long)s.oom_block_id,
                            (long long)s.oom_requested, (long long)s.oom_rounded,
                            (long long)s.oom_device_request, (long long)s.capacity,
                            (long long)s.oom_allocated, (long long)s.oom_reserved,
                            (long long)s.oom_reserved_before, (long long)s.oom_released,
                            (long long)s.oom_largest_free);
    } else {
        oom = Py_None;
        Py_INCREF(oom);
    }
    if (oom == NULL) {
        state_free(&s);
        return NULL;
    }
    PyObject *res = Py_BuildValue(
        "(LLLLLLLLLLLLLLLLN)", (long long)s.peak_allocated, (long long)s.peak_reserved,
        (long long)s.allocated, (long long)s.reserved, (long long)s.peak_requested,
        (long long)s.allocated_at_peak_reserved, (long long)s.largest_free_at_peak_reserved,
        (long long)s.peak_segments, (long long)s.segments, (long long)largest_free(&s),
        (long long)s.num_allocs, (long long)s.num_frees, (long long)s.num_device_alloc,
        (long long)s.num_device_free, (long long)s.num_alloc_retries, (long long)s.unmatched, oom);
    state_free(&s);
    return res;
}

static char *rule_names[] = {"min_block_size", "small_size", "small_buffer", "large_buffer",
                             "min_large_alloc", "round_large", "segment_align", "address_base", NULL};

static PyObject *configure(PyObject *self, PyObject *args, PyObject *kwargs) {
    long long v[8];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$LLLLLLLL:configure", rule_names, &v[0], &v[1], &v[2],
                                     &v[3], &v[4], &v[5], &v[6], &v[7]))
        return NULL;
    for (int i = 0; rule_names[i] != NULL; i++) {
        if (v[i] <= 0) {
            PyErr_Format(PyExc_ValueError, "configure: %s must be > 0", rule_names[i]);
            return NULL;
        }
    }
    R.min_block_size = v[0];
    R.small_size = v[1];
    R.small_buffer = v[2];
    R.large_buffer = v[3];
    R.min_large_alloc = v[4];
    R.round_large = v[5];
    R.segment_align = v[6];
    R.address_base = v[7];
    configured = 1;
    Py_RETURN_NONE;
}

static PyObject *rules(PyObject *self, PyObject *unused) {
    if (!configured)
        Py_RETURN_NONE;
    return Py_BuildValue("{sLsLsLsLsLsLsLsL}", rule_names[0], (long long)R.min_block_size, rule_names[1],
                         (long long)R.small_size, rule_names[2], (long long)R.small_buffer, rule_names[3],
                         (long long)R.large_buffer, rule_names[4], (long long)R.min_large_alloc,
                         rule_names[5], (long long)R.round_large, rule_names[6], (long long)R.segment_align,
                         rule_names[7], (long long)R.address_base);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(*, min_block_size, small_size, small_buffer, large_buffer, min_large_alloc, round_large, "
     "segment_align, address_base): the allocator's rules (vramplan.alloc.rules), before any replay."},
    {"rules", rules, METH_NOARGS, "rules() -> dict: the rules configure() set, or None before it."},
    {"replay", replay, METH_VARARGS,
     "replay(parts, capacity_bytes) -> tuple: the default caching allocator fed compact streams "
     "(lists of ints: n > 0 allocates n bytes as the next block id, n < 0 frees block -n - 1) and runs "
     "(events, strides, count); capacity_bytes -1 for none.  Fields: vramplan.alloc.native.FIELDS."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay",
    "The default caching-allocator replay of a compact event stream, in C (see vramplan.alloc.native).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
