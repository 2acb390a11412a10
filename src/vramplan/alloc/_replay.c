/*
 * vramplan.alloc._replay: the caching-allocator replay of a compact event stream, in C.
 *
 * The fast path of the model whose reference is vramplan/alloc/caching.py CachingAllocator, for
 * PyTorch's default PYTORCH_CUDA_ALLOC_CONF and for expandable_segments:True; both follow
 * c10/cuda/CUDACachingAllocator.cpp:
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
 * With expandable_segments:True (replay's address_space > 0), CachingAllocator's expandable path, function
 * by function (the names of caching.py, which follow the C++ ones):
 *   - _get_free_block: from the first cached block >= the request, move on to the next cached block while
 *     its size plus the unmapped range right after it is smaller than the current one's;
 *   - should_split: split whenever >= kMinBlockSize would be left, in both pools;
 *   - _try_allocate_expandable_block: _find_expandable_block (the lowest-address unmapped range, joined to
 *     the cached block before it, whose run of unallocated blocks holds the request; else a new segment
 *     reserving address_space bytes), then _map_block the missing pages (small_page or large_page
 *     granularity, one device allocation each, checked against the capacity) until the block fits;
 *   - under a capacity, when that fails: _release_cached_blocks unmaps the whole pages of every cached
 *     block (_unmap_block, one device free each; a segment left entirely unmapped is released) and
 *     retries once; the out-of-memory record's device request is the request rounded up to the page;
 *   - the unmapped ranges of each pool are kept ordered by address, the cached blocks by (size, address);
 *     a block merges only with neighbours in the same mapped state.
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
 *             round_large, segment_align, address_base, small_page, large_page) -> None
 *             (rules.py's values)
 *   rules() -> dict of those values, or None before configure()
 *   replay(parts, capacity_bytes, address_space=0) -> tuple
 * parts: a sequence of parts replayed in order, each a list of ints (n > 0 allocates n bytes as the
 * next block id, n < 0 frees block -n - 1, 0 is ignored) or a tuple (events, strides, count) for
 * count windows, window w being events[k] - w * strides[k] (compact.Repeat); capacity_bytes: an
 * int, or -1 for no capacity; address_space: 0 for the default configuration, or the bytes of addresses
 * each expandable segment reserves (rules.expandable_address_space(capacity), computed by native.py) for
 * expandable_segments:True.  The tuple's fields are named in vramplan/alloc/native.py (FIELDS).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the allocator's rules, as rules.py names them (K_MIN_BLOCK_SIZE ...), set once by configure() */
typedef struct {
    int64_t min_block_size, small_size, small_buffer, large_buffer, min_large_alloc, round_large;
    int64_t segment_align, address_base, small_page, large_page;
} Rules;

static Rules R;
static int configured = 0;

typedef struct {
    int64_t addr, size, req;  /* req: requested bytes, 0 for a cached (or unmapped) block */
    int64_t base;             /* address of its segment (the page grid of an expandable segment) */
    int32_t prev, next;       /* neighbours in the segment, -1 for none */
    int16_t small;            /* pool */
    int16_t mapped;           /* 0: an unmapped range of an expandable segment */
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
    Pool small_unmapped, large_unmapped;   /* expandable segments' unmapped ranges, keys (0, addr) */
    int expandable;
    int64_t address_space;     /* expandable: the virtual range of a new segment */
    int64_t capacity;          /* -1: none */
    int64_t next_addr, allocated, reserved, requested;
    int64_t peak_allocated, peak_reserved, peak_requested;
    int64_t segments, peak_segments, num_device_alloc, num_device_free, num_alloc_retries;
    int64_t num_allocs, num_frees, unmatched;
    int64_t allocated_at_peak_reserved, largest_free_at_peak_reserved;
    int peak_moved;            /* reserved reached a new peak in the current malloc */
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

/* ------------------------------------------------------------------ expandable segments */

static inline Pool *free_pool(State *s, int small) { return small ? &s->small : &s->large; }
static inline Pool *unmapped_pool(State *s, int small) { return small ? &s->small_unmapped : &s->large_unmapped; }
static inline int64_t page_of(int small) { return small ? R.small_page : R.large_page; }
static inline int64_t round_up(int64_t n, int64_t m) { return ((n + m - 1) / m) * m; }

static void raise_reserved(State *s, int64_t nbytes) {
    s->reserved += nbytes;
    if (s->reserved > s->peak_reserved) {
        s->peak_reserved = s->reserved;
        s->peak_moved = 1;
    }
}

/* _remove_cached: out of the cached list (mapped) or the unmapped list */
static inline void remove_cached(State *s, int32_t bi) {
    Block *b = &s->blocks[bi];
    if (b->mapped)
        pool_remove(free_pool(s, b->small), b->size, b->addr);
    else
        pool_remove(unmapped_pool(s, b->small), 0, b->addr);
}

static inline int insert_cached(State *s, int32_t bi) {
    Block *b = &s->blocks[bi];
    if (b->mapped)
        return pool_insert(free_pool(s, b->small), b->size, b->addr, bi);
    return pool_insert(unmapped_pool(s, b->small), 0, b->addr, bi);
}

/* _try_merge / _merge: dst absorbs its neighbour src when src is unallocated and in the same mapped state
   (dst is in no list); returns -1 on a memory error */
static int try_merge(State *s, int32_t dst, int32_t src) {
    if (src < 0)
        return 0;
    Block *x = &s->blocks[src];
    Block *d = &s->blocks[dst];
    if (x->req != 0 || x->mapped != d->mapped)
        return 0;
    remove_cached(s, src);
    if (d->prev == src) {
        d->addr = x->addr;
        d->prev = x->prev;
        if (d->prev >= 0)
            s->blocks[d->prev].next = dst;
    } else {
        d->next = x->next;
        if (d->next >= 0)
            s->blocks[d->next].prev = dst;
    }
    d->size += x->size;
    return drop_block(s, src);
}

/* a new block (index, or -1 on a memory error) with these fields, outside any list and unlinked */
static int32_t make_block(State *s, int64_t addr, int64_t size, int64_t base, int small, int mapped) {
    int32_t bi = new_block(s);
    if (bi < 0)
        return -1;
    Block *b = &s->blocks[bi];
    b->addr = addr;
    b->size = size;
    b->req = 0;
    b->base = base;
    b->prev = b->next = -1;
    b->small = (int16_t)small;
    b->mapped = (int16_t)mapped;
    return bi;
}

/* _find_expandable_block: the lowest-address unmapped range (with the cached block before it) whose run of
   unallocated blocks holds rounded bytes; else a new segment of address_space bytes, all unmapped.
   Returns the block, or -1 on a memory error. */
static int32_t find_expandable(State *s, int small, int64_t rounded) {
    Pool *um = unmapped_pool(s, small);
    for (Py_ssize_t k = 0; k < um->n; k++) {
        int32_t cand = um->a[k].block;
        int32_t p = s->blocks[cand].prev;
        if (p >= 0 && s->blocks[p].req == 0)
            cand = p;
        int64_t total = 0;
        int32_t b = cand;
        while (b >= 0 && total < rounded && s->blocks[b].req == 0) {
            total += s->blocks[b].size;
            b = s->blocks[b].next;
        }
        if (total >= rounded)
            return cand;
    }
    int64_t base = s->next_addr;
    s->next_addr += round_up(s->address_space, R.segment_align);
    s->segments++;
    if (s->segments > s->peak_segments)
        s->peak_segments = s->segments;
    int32_t bi = make_block(s, base, s->address_space, base, small, 0);
    if (bi < 0 || insert_cached(s, bi) < 0)
        return -1;
    return bi;
}

/* _map_block: map nbytes (rounded up to whole pages) at the start of the unmapped block bi, which then
   merges with cached neighbours; 1 when done, 0 when the capacity does not allow it, -1 on a memory error */
static int map_block(State *s, int32_t bi, int64_t nbytes) {
    int small = s->blocks[bi].small;
    int64_t mapped = round_up(nbytes, page_of(small));
    if (s->capacity >= 0 && s->reserved + mapped > s->capacity)
        return 0;
    remove_cached(s, bi);
    s->blocks[bi].mapped = 1;
    if (mapped < s->blocks[bi].size) {
        Block *b = &s->blocks[bi];
        int32_t ri = make_block(s, b->addr + mapped, b->size - mapped, b->base, small, 0);
        if (ri < 0)
            return -1;
        b = &s->blocks[bi];   /* make_block may move s->blocks */
        Block *rest = &s->blocks[ri];
        rest->prev = bi;
        rest->next = b->next;
        if (b->next >= 0)
            s->blocks[b->next].prev = ri;
        b->next = ri;
        if (insert_cached(s, ri) < 0)
            return -1;
        b->size = mapped;
    }
    if (try_merge(s, bi, s->blocks[bi].prev) < 0 || try_merge(s, bi, s->blocks[bi].next) < 0)
        return -1;
    if (insert_cached(s, bi) < 0)
        return -1;
    s->num_device_alloc++;
    raise_reserved(s, mapped);
    return 1;
}

/* _try_allocate_expandable_block: the block (out of the cached list), -2 when the capacity does not allow
   it, -1 on an error (exception set or memory) */
static int32_t try_allocate_expandable(State *s, int small, int64_t rounded) {
    int32_t cand = find_expandable(s, small, rounded);
    if (cand < 0)
        return -1;
    if (!s->blocks[cand].mapped) {
        int64_t size = s->blocks[cand].size;
        int rc = map_block(s, cand, size < rounded ? size : rounded);
        if (rc <= 0)
            return rc < 0 ? -1 : -2;
    }
    while (s->blocks[cand].size < rounded) {
        int32_t nxt = s->blocks[cand].next;
        if (nxt < 0 || s->blocks[nxt].mapped) {
            PyErr_SetString(PyExc_RuntimeError, "expandable segment: no unmapped range after a short block");
            return -1;
        }
        int64_t want = rounded - s->blocks[cand].size, size = s->blocks[nxt].size;
        int rc = map_block(s, nxt, size < want ? size : want);
        if (rc <= 0)
            return rc < 0 ? -1 : -2;
        cand = nxt;
    }
    remove_cached(s, cand);
    return cand;
}

/* _unmap_block: unmap the whole pages inside the cached block bi; the bytes unmapped, or -1 on a memory
   error */
static int64_t unmap_block(State *s, int32_t bi) {
    Block *b = &s->blocks[bi];
    int small = b->small;
    int64_t page = page_of(small), base = b->base;
    int64_t begin = (b->addr - base + page - 1) / page;
    int64_t end = (b->addr + b->size - base) / page;
    if (begin >= end)
        return 0;
    remove_cached(s, bi);
    int64_t start = base + begin * page;
    int64_t size = (end - begin) * page;
    int64_t before = start - b->addr;
    if (before > 0) {
        int32_t fi = make_block(s, b->addr, before, base, small, 1);
        if (fi < 0)
            return -1;
        b = &s->blocks[bi];
        Block *f = &s->blocks[fi];
        f->prev = b->prev;
        f->next = bi;
        if (b->prev >= 0)
            s->blocks[b->prev].next = fi;
        b->prev = fi;
        if (insert_cached(s, fi) < 0)
            return -1;
    }
    b = &s->blocks[bi];
    int64_t after = b->size - before - size;
    if (after > 0) {
        int32_t ai = make_block(s, start + size, after, base, small, 1);
        if (ai < 0)
            return -1;
        b = &s->blocks[bi];
        Block *a = &s->blocks[ai];
        a->prev = bi;
        a->next = b->next;
        if (b->next >= 0)
            s->blocks[b->next].prev = ai;
        b->next = ai;
        if (insert_cached(s, ai) < 0)
            return -1;
    }
    b = &s->blocks[bi];
    b->addr = start;
    b->size = size;
    b->mapped = 0;
    if (try_merge(s, bi, s->blocks[bi].prev) < 0 || try_merge(s, bi, s->blocks[bi].next) < 0)
        return -1;
    if (insert_cached(s, bi) < 0)
        return -1;
    s->reserved -= size;
    s->num_device_free++;
    return size;
}

/* _release_cached_blocks with expandable segments: large pool first, the cached blocks in (size, address)
   order as they stood, each unmapped; a segment left as one unmapped block is released.  The bytes
   unmapped, or -1 on a memory error. */
static int64_t release_cached_expandable(State *s) {
    int64_t released = 0;
    int smalls[2] = {0, 1};
    for (int k = 0; k < 2; k++) {
        Pool *p = free_pool(s, smalls[k]);
        Py_ssize_t n = p->n;
        int32_t *order = (int32_t *)malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (order == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < n; i++)
            order[i] = p->a[i].block;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t bi = order[i];
            int64_t got = unmap_block(s, bi);
            if (got < 0) {
                free(order);
                return -1;
            }
            released += got;
            Block *b = &s->blocks[bi];
            if (!b->mapped && b->prev < 0 && b->next < 0) {
                remove_cached(s, bi);
                s->segments--;
                if (drop_block(s, bi) < 0) {
                    free(order);
                    return -1;
                }
            }
        }
        free(order);
    }
    return released;
}

static void record_oom(State *s, int64_t index, int64_t n, int64_t r, int64_t device_request, int64_t before,
                       int64_t released) {
    s->oom = 1;
    s->oom_index = index;
    s->oom_block_id = s->nlive;
    s->oom_requested = n;
    s->oom_rounded = r;
    s->oom_device_request = device_request;
    s->oom_allocated = s->allocated;
    s->oom_reserved = s->reserved;
    s->oom_reserved_before = before;
    s->oom_released = released;
    s->oom_largest_free = largest_free(s);
}

/* the expandable path of malloc up to alloc_found_block: the block for rounded bytes in *out (out of every
   list); 0, 1 when out of memory, -1 on an error */
static int expandable_block(State *s, int small, int64_t n, int64_t r, int64_t index, int32_t *out) {
    Pool *pool = free_pool(s, small);
    Py_ssize_t i = lower_bound(pool, r, INT64_MIN);
    if (i < pool->n) {
        /* _get_free_block: a block counts as large as it could grow into the unmapped range after it */
        int64_t g = 0;
        {
            const Block *b = &s->blocks[pool->a[i].block];
            g = b->size + (b->next >= 0 && !s->blocks[b->next].mapped ? s->blocks[b->next].size : 0);
        }
        while (i + 1 < pool->n) {
            const Block *b = &s->blocks[pool->a[i + 1].block];
            int64_t g1 = b->size + (b->next >= 0 && !s->blocks[b->next].mapped ? s->blocks[b->next].size : 0);
            if (g1 >= g)
                break;
            g = g1;
            i++;
        }
        *out = pool->a[i].block;
        pool_remove_at(pool, i);
        return 0;
    }
    int32_t bi = try_allocate_expandable(s, small, r);
    if (bi == -2) {
        int64_t before = s->reserved;
        int64_t released = release_cached_expandable(s);
        if (released < 0)
            return -1;
        s->num_alloc_retries++;
        bi = try_allocate_expandable(s, small, r);
        if (bi == -2) {
            record_oom(s, index, n, r, round_up(r, page_of(small)), before, released);
            return 1;
        }
    }
    if (bi < 0)
        return -1;
    *out = bi;
    return 0;
}

/* one event; returns 0, 1 when out of memory, -1 on an error (an exception set, or none for memory) */
static int step(State *s, int64_t n, int64_t index) {
    if (n > 0) {
        /* round_size (n > 0, so never below min_block_size) */
        int64_t r = ((n + R.min_block_size - 1) / R.min_block_size) * R.min_block_size;
        int small = r <= R.small_size;
        Pool *pool = small ? &s->small : &s->large;
        int32_t bi;
        if (s->expandable) {
            int rc = expandable_block(s, small, n, r, index, &bi);
            if (rc != 0)
                return rc;
        } else {
            Py_ssize_t i = lower_bound(pool, r, INT64_MIN);
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
                        record_oom(s, index, n, r, size, before, released);
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
                b->base = b->addr;
                b->prev = b->next = -1;
                b->small = (int16_t)small;
                b->mapped = 1;
                s->next_addr += ((size + R.segment_align - 1) / R.segment_align) * R.segment_align;
                s->segments++;
                if (s->segments > s->peak_segments)
                    s->peak_segments = s->segments;
                s->num_device_alloc++;
                raise_reserved(s, size);
            } else {
                bi = pool->a[i].block;
                pool_remove_at(pool, i);
            }
        }
        int64_t rem = s->blocks[bi].size - r;
        int32_t out;
        /* should_split without max_split_size: every pool splits like the small one with expandable segments */
        if ((small || s->expandable) ? rem >= R.min_block_size : rem > R.small_size) {
            int32_t nb = new_block(s);   /* may move s->blocks */
            if (nb < 0)
                return -1;
            Block *b = &s->blocks[bi];
            Block *x = &s->blocks[nb];
            x->addr = b->addr;
            x->size = r;
            x->req = n;
            x->base = b->base;
            x->prev = b->prev;
            x->next = bi;
            x->small = (int16_t)small;
            x->mapped = 1;
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
        if (s->peak_moved) {
            /* the peak of reserved bytes moved in this malloc: what is allocated and cached once the
               block is handed out */
            s->peak_moved = 0;
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
        if (b->prev >= 0 && s->blocks[b->prev].req == 0 && s->blocks[b->prev].mapped) {
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
        if (b->next >= 0 && s->blocks[b->next].req == 0 && s->blocks[b->next].mapped) {
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
    free(s->small_unmapped.a);
    free(s->large_unmapped.a);
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
        if (rc < 0 && !PyErr_Occurred())
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
    if (rc < 0 && !PyErr_Occurred())
        PyErr_NoMemory();
    return rc;
}

static PyObject *replay(PyObject *self, PyObject *args) {
    PyObject *parts;
    long long capacity, address_space = 0;
    if (!PyArg_ParseTuple(args, "OL|L:replay", &parts, &capacity, &address_space))
        return NULL;
    if (address_space < 0) {
        PyErr_SetString(PyExc_ValueError, "replay: address_space must be >= 0 (0: no expandable segments)");
        return NULL;
    }
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
    s.expandable = address_space > 0;
    s.address_space = (int64_t)address_space;
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
                             "min_large_alloc", "round_large", "segment_align", "address_base",
                             "small_page", "large_page", NULL};

static PyObject *configure(PyObject *self, PyObject *args, PyObject *kwargs) {
    long long v[10];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "$LLLLLLLLLL:configure", rule_names, &v[0], &v[1], &v[2],
                                     &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9]))
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
    R.small_page = v[8];
    R.large_page = v[9];
    configured = 1;
    Py_RETURN_NONE;
}

static PyObject *rules(PyObject *self, PyObject *unused) {
    if (!configured)
        Py_RETURN_NONE;
    return Py_BuildValue("{sLsLsLsLsLsLsLsLsLsL}", rule_names[0], (long long)R.min_block_size, rule_names[1],
                         (long long)R.small_size, rule_names[2], (long long)R.small_buffer, rule_names[3],
                         (long long)R.large_buffer, rule_names[4], (long long)R.min_large_alloc,
                         rule_names[5], (long long)R.round_large, rule_names[6], (long long)R.segment_align,
                         rule_names[7], (long long)R.address_base, rule_names[8], (long long)R.small_page,
                         rule_names[9], (long long)R.large_page);
}

static PyMethodDef methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "configure(*, min_block_size, small_size, small_buffer, large_buffer, min_large_alloc, round_large, "
     "segment_align, address_base, small_page, large_page): the allocator's rules (vramplan.alloc.rules), "
     "before any replay."},
    {"rules", rules, METH_NOARGS, "rules() -> dict: the rules configure() set, or None before it."},
    {"replay", replay, METH_VARARGS,
     "replay(parts, capacity_bytes, address_space=0) -> tuple: the caching allocator fed compact streams "
     "(lists of ints: n > 0 allocates n bytes as the next block id, n < 0 frees block -n - 1) and runs "
     "(events, strides, count); capacity_bytes -1 for none; address_space > 0 turns on expandable "
     "segments, each reserving that many bytes of addresses.  Fields: vramplan.alloc.native.FIELDS."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay",
    "The caching-allocator replay of a compact event stream, in C (see vramplan.alloc.native).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module); }
