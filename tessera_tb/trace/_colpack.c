/* Pack a step's columns in C: difference coding, byte planes and Zstandard, the GIL released.
 *
 * columns.encode_many hands a step's columns here in one call. pack_columns (below) does
 * all of what columns._layout and columns._pack_all do in Python, byte for byte: each
 * column's values split into byte planes (the first byte of every value, then the second,
 * ...), their differences laid out the same way where they may be stored, each form
 * compressed with Zstandard and the smaller kept (a long column that chooses does so on a
 * few probe blocks). layout_columns does the layout alone, for where no Zstandard could be
 * bound: Python then compresses the forms with the zstandard package and chooses.
 *
 * In Python every column costs several numpy calls, each taking the GIL back; an importer
 * encodes steps in several threads, which then queue for the GIL between calls.
 *
 * layout_columns(jobs, min_bytes, probe_values) -> list
 *   jobs: list of (array, mode[, starts]): a C-contiguous little-endian buffer of 1, 2, 4 or
 *   8-byte values; mode 0 plain, 1 differences, 2 choose (integers only); starts, for a long
 *   column that chooses: the first value of each probe block of probe_values values.
 *   Returns one (shuffle, plain, diffs, probes) tuple per job: plain and diffs the laid-out
 *   bytes of the values and of their differences (None where that form is not wanted),
 *   probes None or a tuple of (plain, diffs) pairs, one per probe block. The result's bytes
 *   objects are made first, then filled with the GIL released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if !defined(_WIN32)
#include <dlfcn.h>
#include <pthread.h>
#define COLPACK_ZSTD 1
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { MODE_PLAIN = 0, MODE_DELTA = 1, MODE_CHOOSE = 2 };
#define MAX_PROBES 64

/* One form's stored bytes (pack_form): compressed where it is at least min_bytes long and
 * that makes it smaller, else the form itself. */
typedef struct {
    unsigned char *data;
    size_t len;
    int compressed;
} Packed;

/* A column to pack (parse_job): its values, how they are coded, and what pack_columns and
 * pack_step make of it. */
typedef struct {
    Py_buffer view;
    int held;
    Py_ssize_t n;
    int width, mode, choose, delta_only;
    Py_ssize_t starts[MAX_PROBES];
    Py_ssize_t n_starts;
    int delta;
    int dtype_code; /* the Column's dtype (pack_step) */
    Packed packed;
} PackJob;

/* jobs[i] from (array, mode[, starts]) (with_dtype: (array, mode, starts, dtype code)); -1
 * with an exception set. The buffer is held from here on (j->held). */
static int parse_job(PyObject *item, PackJob *j, Py_ssize_t min_bytes, Py_ssize_t probe_values,
                     int with_dtype) {
    PyObject *arr, *starts = Py_None;
    int mode, code = 0;
    int ok = PyTuple_Check(item) &&
             (with_dtype ? PyArg_ParseTuple(item, "OiOi", &arr, &mode, &starts, &code)
                         : PyArg_ParseTuple(item, "Oi|O", &arr, &mode, &starts));
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, with_dtype ? "each column is (array, mode, starts, dtype)"
                                                        : "each job is (array, mode[, starts])");
        return -1;
    }
    if (PyObject_GetBuffer(arr, &j->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    j->held = 1;
    j->dtype_code = code;
    int w = (int)j->view.itemsize;
    if (w != 1 && w != 2 && w != 4 && w != 8) {
        PyErr_Format(PyExc_ValueError, "values of %d bytes cannot be packed", w);
        return -1;
    }
    if (mode < MODE_PLAIN || mode > MODE_CHOOSE) {
        PyErr_Format(PyExc_ValueError, "unknown mode %d", mode);
        return -1;
    }
    j->width = w;
    j->n = j->view.len / w;
    j->mode = mode;
    j->choose = mode == MODE_CHOOSE && j->n > 2 && j->view.len >= min_bytes;
    j->delta_only = mode == MODE_DELTA && j->n > 0;
    if (j->choose && starts != Py_None) {
        if (!PyTuple_Check(starts) || PyTuple_GET_SIZE(starts) > MAX_PROBES) {
            PyErr_Format(PyExc_TypeError, "probe starts: a tuple of at most %d ints", MAX_PROBES);
            return -1;
        }
        j->n_starts = PyTuple_GET_SIZE(starts);
        for (Py_ssize_t b = 0; b < j->n_starts; b++) {
            Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(starts, b));
            if (at == -1 && PyErr_Occurred()) return -1;
            if (at < 0 || at + probe_values > j->n) {
                PyErr_Format(PyExc_ValueError, "probe block at %zd is outside the column", at);
                return -1;
            }
            j->starts[b] = at;
        }
    }
    return 0;
}

/* layout_columns' job: the column, and the bytes objects of its forms, made with the GIL
 * and filled without it. */
typedef struct {
    PackJob c;
    PyObject *plain, *diffs;
    PyObject *probes[MAX_PROBES][2];
} Job;

/* A list of item(job) for `count` jobs laid `stride` bytes apart from `first`; NULL with
 * the exception of the item that failed. */
static PyObject *list_of(Py_ssize_t count, PyObject *(*item)(const void *), const void *first,
                         size_t stride) {
    PyObject *list = PyList_New(count);
    if (!list) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = item((const char *)first + (size_t)i * stride);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

/* min_bytes and probe_values as the callers pass them; else ValueError. */
static int check_sizes(Py_ssize_t min_bytes, Py_ssize_t probe_values) {
    if (min_bytes < 0 || probe_values < 1) {
        PyErr_SetString(PyExc_ValueError, "min_bytes and probe_values must be positive");
        return -1;
    }
    return 0;
}

/* Sixteen bytes of differences at a time from value i on (SSE2), i advanced past them;
 * nothing where SSE2 is missing (`sub` is then not used). */
#if defined(__SSE2__)
#define DIFFERENCES_WIDE(type, sub)                                                     \
    for (; i + 16 / (Py_ssize_t)sizeof(type) <= n; i += 16 / (Py_ssize_t)sizeof(type)) { \
        __m128i v = _mm_loadu_si128((const __m128i *)(src + sizeof(type) * i));         \
        __m128i p = _mm_loadu_si128((const __m128i *)(src + sizeof(type) * (i - 1)));   \
        _mm_storeu_si128((__m128i *)(dst + sizeof(type) * i), sub(v, p));              \
    }
#else
#define DIFFERENCES_WIDE(type, sub)
#endif

/* Differences from the previous value, the first from 0, wrapping like numpy's subtract:
 * unsigned arithmetic of the values' width (memcpy: the values need not be aligned). Each
 * value less the one before it, both loaded from the source: no value is carried from one
 * to the next, so sixteen bytes go at a time where SSE2 is there (48.3 ms against 57.7 ms
 * for the 50x copy's 7,500 step columns with the previous value carried). */
#define DIFFERENCES(type, sub)                                     \
    do {                                                           \
        Py_ssize_t i = 1;                                          \
        if (n > 0) memcpy(dst, src, sizeof(type));                 \
        DIFFERENCES_WIDE(type, sub)                                \
        for (; i < n; i++) {                                       \
            type v, p, d;                                          \
            memcpy(&v, src + sizeof(type) * i, sizeof v);          \
            memcpy(&p, src + sizeof(type) * (i - 1), sizeof p);    \
            d = (type)(v - p);                                     \
            memcpy(dst + sizeof(type) * i, &d, sizeof d);          \
        }                                                          \
    } while (0)

static void differences(const unsigned char *src, unsigned char *dst, Py_ssize_t n, int width) {
    switch (width) {
    case 1: DIFFERENCES(uint8_t, _mm_sub_epi8); break;
    case 2: DIFFERENCES(uint16_t, _mm_sub_epi16); break;
    case 4: DIFFERENCES(uint32_t, _mm_sub_epi32); break;
    default: DIFFERENCES(uint64_t, _mm_sub_epi64); break;
    }
}

/* Byte planes: plane b holds byte b of every value; one value (or 1-byte values) as is. */
static inline void split_planes_scalar(const unsigned char *src, unsigned char *dst,
                                       Py_ssize_t from, Py_ssize_t n, int width) {
    for (Py_ssize_t i = from; i < n; i++)
        for (int b = 0; b < width; b++) dst[(Py_ssize_t)b * n + i] = src[i * width + b];
}

#if defined(__SSE2__)
/* Sixteen values at a time: their `width` 16-byte rows are interleaved byte by byte four
 * times, row k with row k + width/2 each time (a perfect shuffle); after the fourth, row b
 * holds byte b of the sixteen values in order. The width is a constant where this is
 * inlined, so the loops unroll. */
static inline __attribute__((always_inline)) void split_planes_16(const unsigned char *src,
                                                                  unsigned char *dst,
                                                                  Py_ssize_t n, int width) {
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i r[8], t[8];
        for (int k = 0; k < width; k++)
            r[k] = _mm_loadu_si128((const __m128i *)(src + i * width + 16 * k));
        for (int round = 0; round < 4; round++) {
            for (int k = 0; k < width / 2; k++) {
                t[2 * k] = _mm_unpacklo_epi8(r[k], r[k + width / 2]);
                t[2 * k + 1] = _mm_unpackhi_epi8(r[k], r[k + width / 2]);
            }
            for (int k = 0; k < width; k++) r[k] = t[k];
        }
        for (int b = 0; b < width; b++)
            _mm_storeu_si128((__m128i *)(dst + (Py_ssize_t)b * n + i), r[b]);
    }
    split_planes_scalar(src, dst, i, n, width);
}
#endif

static void split_planes(const unsigned char *src, unsigned char *dst, Py_ssize_t n, int width) {
    if (width == 1 || n < 2) {
        memcpy(dst, src, (size_t)n * (size_t)width);
        return;
    }
#if defined(__SSE2__)
    switch (width) {
    case 2: split_planes_16(src, dst, n, 2); return;
    case 4: split_planes_16(src, dst, n, 4); return;
    default: split_planes_16(src, dst, n, 8); return;
    }
#else
    split_planes_scalar(src, dst, 0, n, width);
#endif
}

static unsigned char *bytes_of(PyObject *b) { return (unsigned char *)PyBytes_AS_STRING(b); }

/* The planes of n values at src into out; of their differences too where diffs is given
 * (scratch: n values' room). */
static void lay_out(const unsigned char *src, Py_ssize_t n, int w, PyObject *plain,
                    PyObject *diffs, unsigned char *scratch) {
    if (plain) split_planes(src, bytes_of(plain), n, w);
    if (diffs) {
        differences(src, scratch, n, w);
        split_planes(scratch, bytes_of(diffs), n, w);
    }
}

static int run_job(Job *j, Py_ssize_t probe_values, unsigned char **scratch, size_t *cap) {
    size_t need = (size_t)j->c.n * (size_t)j->c.width;
    if (j->c.n_starts && (size_t)probe_values * (size_t)j->c.width > need)
        need = (size_t)probe_values * (size_t)j->c.width;
    if (j->diffs && need > *cap) {
        unsigned char *q = realloc(*scratch, need);
        if (!q) return -1;
        *scratch = q;
        *cap = need;
    }
    const unsigned char *src = j->c.view.buf;
    for (Py_ssize_t b = 0; b < j->c.n_starts; b++)
        lay_out(src + (size_t)j->c.starts[b] * j->c.width, probe_values, j->c.width, j->probes[b][0],
                j->probes[b][1], *scratch);
    lay_out(src, j->c.n, j->c.width, j->plain, j->diffs, *scratch);
    return 0;
}

static PyObject *new_bytes(Py_ssize_t n) { return PyBytes_FromStringAndSize(NULL, n); }

static PyObject *job_result(const void *job) {
    const Job *j = job;
    int shuffle = j->c.width > 1 && j->c.n > 1;
    PyObject *probes = Py_None;
    Py_INCREF(Py_None);
    if (j->c.n_starts) {
        Py_DECREF(Py_None);
        probes = PyTuple_New(j->c.n_starts);
        if (!probes) return NULL;
        for (Py_ssize_t b = 0; b < j->c.n_starts; b++) {
            PyObject *pair = PyTuple_Pack(2, j->probes[b][0], j->probes[b][1]);
            if (!pair) {
                Py_DECREF(probes);
                return NULL;
            }
            PyTuple_SET_ITEM(probes, b, pair);
        }
    }
    PyObject *t = Py_BuildValue("(OOON)", shuffle ? Py_True : Py_False,
                                j->plain ? j->plain : Py_None, j->diffs ? j->diffs : Py_None,
                                probes);
    return t;
}

static PyObject *layout_columns(PyObject *self, PyObject *args) {
    PyObject *jobs_obj;
    Py_ssize_t min_bytes, probe_values;
    if (!PyArg_ParseTuple(args, "O!nn", &PyList_Type, &jobs_obj, &min_bytes, &probe_values))
        return NULL;
    if (check_sizes(min_bytes, probe_values)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(jobs_obj);
    Job *jobs = calloc(count ? count : 1, sizeof(Job));
    if (!jobs) return PyErr_NoMemory();
    PyObject *result = NULL;
    unsigned char *scratch = NULL;
    size_t scratch_cap = 0;

    for (Py_ssize_t i = 0; i < count; i++) {
        Job *j = &jobs[i];
        if (parse_job(PyList_GET_ITEM(jobs_obj, i), &j->c, min_bytes, probe_values, 0)) goto done;
        /* columns._layout: which forms are wanted */
        Py_ssize_t len = j->c.view.len, w = j->c.width;
        for (Py_ssize_t b = 0; b < j->c.n_starts; b++) {
            if (!(j->probes[b][0] = new_bytes(probe_values * w))) goto done;
            if (!(j->probes[b][1] = new_bytes(probe_values * w))) goto done;
        }
        if (!j->c.delta_only && !(j->plain = new_bytes(len))) goto done;
        if ((j->c.delta_only || j->c.choose) && !(j->diffs = new_bytes(len))) goto done;
    }

    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && !failed; i++)
        failed = run_job(&jobs[i], probe_values, &scratch, &scratch_cap) != 0;
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }

    result = list_of(count, job_result, jobs, sizeof *jobs);

done:
    for (Py_ssize_t i = 0; i < count; i++) {
        Job *j = &jobs[i];
        if (j->c.held) PyBuffer_Release(&j->c.view);
        Py_XDECREF(j->plain);
        Py_XDECREF(j->diffs);
        for (Py_ssize_t b = 0; b < MAX_PROBES; b++) {
            Py_XDECREF(j->probes[b][0]);
            Py_XDECREF(j->probes[b][1]);
        }
    }
    free(jobs);
    free(scratch);
    return result;
}

#if COLPACK_ZSTD
typedef void ZSTD_CCtx;
static struct {
    size_t (*compressBound)(size_t);
    unsigned (*isError)(size_t);
    const char *(*getErrorName)(size_t);
    ZSTD_CCtx *(*createCCtx)(void);
    size_t (*freeCCtx)(ZSTD_CCtx *);
    size_t (*setParameter)(ZSTD_CCtx *, int, int);
    size_t (*compress2)(ZSTD_CCtx *, void *, size_t, const void *, size_t);
    unsigned (*versionNumber)(void);
} Z;
static int z_bound = 0;
static pthread_key_t z_key;
/* Zstandard's parameter numbers (zstd.h, ZSTD_cParameter; stable API). */
enum { ZC_LEVEL = 100, ZC_CONTENT_SIZE = 200, ZC_CHECKSUM = 201, ZC_DICT_ID = 202 };

static void free_cctx(void *cctx) {
    if (cctx) Z.freeCCtx(cctx);
}

static PyObject *bind_zstd(PyObject *self, PyObject *args) {
    const char *path;
    unsigned want;
    if (!PyArg_ParseTuple(args, "sI", &path, &want)) return NULL;
    if (z_bound) return PyBool_FromLong(Z.versionNumber() == want);
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) Py_RETURN_FALSE;
#define TAKE(field, name)                                   \
    if (!(*(void **)&Z.field = dlsym(lib, name))) {         \
        memset(&Z, 0, sizeof Z);                            \
        Py_RETURN_FALSE;                                    \
    }
    TAKE(compressBound, "ZSTD_compressBound");
    TAKE(isError, "ZSTD_isError");
    TAKE(getErrorName, "ZSTD_getErrorName");
    TAKE(createCCtx, "ZSTD_createCCtx");
    TAKE(freeCCtx, "ZSTD_freeCCtx");
    TAKE(setParameter, "ZSTD_CCtx_setParameter");
    TAKE(compress2, "ZSTD_compress2");
    TAKE(versionNumber, "ZSTD_versionNumber");
#undef TAKE
    /* The library stays loaded: its functions are called for the life of the process. */
    if (Z.versionNumber() != want || pthread_key_create(&z_key, free_cctx) != 0) {
        memset(&Z, 0, sizeof Z);
        Py_RETURN_FALSE;
    }
    z_bound = 1;
    Py_RETURN_TRUE;
}

/* Zstandard bound (bind_zstd); else RuntimeError. */
static int check_bound(void) {
    if (z_bound) return 0;
    PyErr_SetString(PyExc_RuntimeError, "no Zstandard bound (bind_zstd)");
    return -1;
}

/* This thread's compression context at `level` (made on first use, freed when the thread
 * ends); NULL when it cannot be made. */
static ZSTD_CCtx *thread_cctx(int level) {
    ZSTD_CCtx *c = pthread_getspecific(z_key);
    if (c) {
        if (Z.isError(Z.setParameter(c, ZC_LEVEL, level))) return NULL;
        return c;
    }
    c = Z.createCCtx();
    if (!c) return NULL;
    /* what zstandard.ZstdCompressor(level, write_checksum=False, write_content_size=True)
     * sets: the frames carry their size and no checksum */
    if (Z.isError(Z.setParameter(c, ZC_LEVEL, level)) ||
        Z.isError(Z.setParameter(c, ZC_CONTENT_SIZE, 1)) ||
        Z.isError(Z.setParameter(c, ZC_CHECKSUM, 0)) ||
        Z.isError(Z.setParameter(c, ZC_DICT_ID, 1)) || pthread_setspecific(z_key, c) != 0) {
        Z.freeCCtx(c);
        return NULL;
    }
    return c;
}

/* Memory that packing reuses from one column to the next within a call: a form's
 * differences, the laid-out form, and the stored bytes of each of two forms. Only the form
 * kept gets memory of its own (keep), so the encoding threads, which share glibc's one
 * arena during an import (background.import_malloc), seldom wait on its lock: a malloc,
 * a realloc and a free per form made them wait there. */
typedef struct {
    unsigned char *p;
    size_t cap;
} Buf;

typedef struct {
    Buf diffs, form, z[2];
} Scratch;

static void free_scratch(Scratch *sc) {
    free(sc->diffs.p);
    free(sc->form.p);
    free(sc->z[0].p);
    free(sc->z[1].p);
}

typedef struct {
    ZSTD_CCtx *cctx;
    size_t min_bytes;
    const char *error; /* a Zstandard error's name, or "memory" */
} Packer;

/* b holds at least need bytes (its contents are not kept). */
static int room(Packer *p, Buf *b, size_t need) {
    if (need <= b->cap && b->p) return 0;
    free(b->p);
    b->p = malloc(need ? need : 1);
    b->cap = b->p ? need : 0;
    if (!b->p) {
        p->error = "memory";
        return -1;
    }
    return 0;
}

/* A form's stored bytes into slot z[slot], which *out then borrows: compressed where the
 * form is at least min_bytes long and that makes it smaller, else the form as it is. */
static int pack_form(Packer *p, Scratch *sc, int slot, const unsigned char *form, size_t len,
                     Packed *out) {
    Buf *z = &sc->z[slot];
    out->len = len;
    out->compressed = 0;
    if (len >= p->min_bytes) {
        size_t cap = Z.compressBound(len);
        if (room(p, z, cap)) return -1;
        size_t made = Z.compress2(p->cctx, z->p, cap, form, len);
        if (Z.isError(made)) {
            p->error = Z.getErrorName(made);
            return -1;
        }
        if (made < len) {
            out->data = z->p;
            out->len = made;
            out->compressed = 1;
            return 0;
        }
    }
    if (room(p, z, len)) return -1;
    if (len) memcpy(z->p, form, len);
    out->data = z->p;
    return 0;
}

/* A copy of a borrowed form's stored bytes, the job's own (freed with the job). */
static int keep(Packer *p, const Packed *borrowed, Packed *out) {
    unsigned char *data = malloc(borrowed->len ? borrowed->len : 1);
    if (!data) {
        p->error = "memory";
        return -1;
    }
    if (borrowed->len) memcpy(data, borrowed->data, borrowed->len);
    out->data = data;
    out->len = borrowed->len;
    out->compressed = borrowed->compressed;
    return 0;
}

/* A form of n values at src laid out into sc->form: their planes, or those of their
 * differences. */
static int lay_form(Packer *p, Scratch *sc, const unsigned char *src, Py_ssize_t n, int w,
                    int diffs) {
    size_t len = (size_t)n * (size_t)w;
    if (room(p, &sc->form, len)) return -1;
    if (diffs) {
        if (room(p, &sc->diffs, len)) return -1;
        differences(src, sc->diffs.p, n, w);
        split_planes(sc->diffs.p, sc->form.p, n, w);
    } else {
        split_planes(src, sc->form.p, n, w);
    }
    return 0;
}

/* The form of n values at src packed into slot z[slot] (*out borrows it). */
static int pack_laid_out(Packer *p, Scratch *sc, int slot, const unsigned char *src,
                         Py_ssize_t n, int w, int diffs, Packed *out) {
    if (lay_form(p, sc, src, n, w, diffs)) return -1;
    return pack_form(p, sc, slot, sc->form.p, (size_t)n * (size_t)w, out);
}

static int pack_job(Packer *p, PackJob *j, Py_ssize_t probe_values, Scratch *sc) {
    int w = j->width;
    const unsigned char *src = j->view.buf;
    Packed form;
    if (j->n_starts) {
        /* columns._pack_all: the probe blocks' packed sizes, summed per form */
        size_t sums[2] = {0, 0};
        for (Py_ssize_t b = 0; b < j->n_starts; b++) {
            for (int d = 0; d < 2; d++) {
                if (pack_laid_out(p, sc, 0, src + (size_t)j->starts[b] * w, probe_values, w,
                                  d, &form))
                    return -1;
                sums[d] += form.len;
            }
        }
        j->delta = sums[1] < sums[0];
        if (pack_laid_out(p, sc, 0, src, j->n, w, j->delta, &form)) return -1;
        return keep(p, &form, &j->packed);
    }
    Packed as_is = {NULL, 0, 0}, as_diffs = {NULL, 0, 0};
    int has_plain = !j->delta_only, has_diffs = j->delta_only || j->choose;
    if (has_plain && pack_laid_out(p, sc, 0, src, j->n, w, 0, &as_is)) return -1;
    if (has_diffs && pack_laid_out(p, sc, 1, src, j->n, w, 1, &as_diffs)) return -1;
    j->delta = has_diffs && (!has_plain || as_diffs.len < as_is.len);
    return keep(p, j->delta ? &as_diffs : &as_is, &j->packed);
}

/* Every job packed in this thread's compression context at `level`, without the GIL;
 * -1 with p->error set. The scratch is the caller's to free (free_scratch). */
static int pack_jobs(Packer *p, PackJob *jobs, Py_ssize_t count, Py_ssize_t probe_values,
                     int level, Scratch *sc) {
    p->cctx = thread_cctx(level);
    if (!p->cctx) {
        p->error = "no compression context";
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (pack_job(p, &jobs[i], probe_values, sc)) return -1;
    return 0;
}

/* The exception for a failed pack_jobs (with the GIL). */
static void raise_pack_error(const Packer *p, const char *what) {
    if (p->error && strcmp(p->error, "memory") == 0)
        PyErr_NoMemory();
    else
        PyErr_Format(PyExc_RuntimeError, "%s: %s", what, p->error ? p->error : "failed");
}

/* pack_columns' (delta, shuffle, compressed, bytes) of a packed job. */
static PyObject *packed_result(const void *job) {
    const PackJob *j = job;
    int shuffle = j->width > 1 && j->n > 1;
    return Py_BuildValue("(OOOy#)", j->delta ? Py_True : Py_False, shuffle ? Py_True : Py_False,
                         j->packed.compressed ? Py_True : Py_False,
                         (const char *)(j->packed.data ? j->packed.data : (unsigned char *)""),
                         (Py_ssize_t)j->packed.len);
}

static PyObject *pack_columns(PyObject *self, PyObject *args) {
    PyObject *jobs_obj;
    Py_ssize_t min_bytes, probe_values;
    int level;
    if (!PyArg_ParseTuple(args, "O!nni", &PyList_Type, &jobs_obj, &min_bytes, &probe_values,
                          &level))
        return NULL;
    if (check_bound() || check_sizes(min_bytes, probe_values)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(jobs_obj);
    PackJob *jobs = calloc(count ? count : 1, sizeof(PackJob));
    if (!jobs) return PyErr_NoMemory();
    PyObject *result = NULL;
    Scratch sc = {{NULL, 0}, {NULL, 0}, {{NULL, 0}, {NULL, 0}}};

    for (Py_ssize_t i = 0; i < count; i++)
        if (parse_job(PyList_GET_ITEM(jobs_obj, i), &jobs[i], min_bytes, probe_values, 0)) goto done;

    Packer p = {NULL, (size_t)min_bytes, NULL};
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = pack_jobs(&p, jobs, count, probe_values, level, &sc);
    Py_END_ALLOW_THREADS
    if (failed) {
        raise_pack_error(&p, "Zstandard");
        goto done;
    }

    result = list_of(count, packed_result, jobs, sizeof *jobs);

done:
    for (Py_ssize_t i = 0; i < count; i++) {
        if (jobs[i].held) PyBuffer_Release(&jobs[i].view);
        free(jobs[i].packed.data);
    }
    free(jobs);
    free_scratch(&sc);
    return result;
}

/* ---- pack_step: a step's column-bearing fields, as protobuf writes them -------------------
 *
 * writer.encode_step's columns in one call: every column of the step's events, attributes
 * and flows packed as pack_columns packs them, and the Step message's fields that hold them
 * (events, attrs, flows) written out as bytes, the way a protobuf encoder writes them (fields
 * in number order, proto3 defaults left out, each message's length before it); the string
 * table's JSON is compressed in the same call. The writer puts these bytes between the
 * fields before them and those after them, each serialised by protobuf itself, so the file is
 * the message's own serialisation, byte for byte (tests/trace/test_colpack.py). Nothing but
 * making the result objects holds the GIL.
 *
 * pack_step(events, attrs, flows, strings_json, min_bytes, probe_values, level)
 *     -> (strings_compressed, strings_data, fragment)
 *   events: (count, columns): Events' columns in field order from EVENTS_FIRST_COLUMN on,
 *     each (array, mode, starts, dtype code);
 *   attrs: list of (key as UTF-8 bytes, type code, rows column, values column);
 *   flows: None, or (count, columns) as events', from FLOWS_FIRST_COLUMN on.
 * STEP_SCHEMA: the field numbers written here, for columns.py to check against the
 * message's descriptors before using this.
 */
enum {
    STEP_EVENTS = 9, STEP_ATTRS = 10, STEP_FLOWS = 11,
    EVENTS_COUNT = 1, EVENTS_FIRST_COLUMN = 2,
    ATTR_KEY = 1, ATTR_TYPE = 2, ATTR_ROWS = 3, ATTR_VALUES = 4,
    FLOWS_COUNT = 1, FLOWS_FIRST_COLUMN = 2,
    COL_DTYPE = 1, COL_CODEC = 2, COL_COUNT = 3, COL_DELTA = 4, COL_SHUFFLE = 5, COL_DATA = 6,
    CODEC_NONE = 0, CODEC_ZSTD = 2,
    WIRE_VARINT = 0, WIRE_LEN = 2,
};

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) v >>= 7, n++;
    return n;
}

static unsigned char *put_varint(unsigned char *o, uint64_t v) {
    while (v >= 0x80) *o++ = (unsigned char)(v | 0x80), v >>= 7;
    *o++ = (unsigned char)v;
    return o;
}

/* Every field number here is below 16: a tag is one byte. */
static unsigned char *put_tag(unsigned char *o, int field, int wire) {
    *o++ = (unsigned char)(field << 3 | wire);
    return o;
}

/* A varint field, left out at its default (0). */
static size_t varint_field_size(uint64_t v) { return v ? 1 + varint_size(v) : 0; }
static unsigned char *put_varint_field(unsigned char *o, int field, uint64_t v) {
    if (!v) return o;
    return put_varint(put_tag(o, field, WIRE_VARINT), v);
}

/* A length-delimited field of `len` bytes: its size with the tag and length. */
static size_t len_field_size(size_t len) { return 1 + varint_size(len) + len; }
static unsigned char *put_len_prefix(unsigned char *o, int field, size_t len) {
    return put_varint(put_tag(o, field, WIRE_LEN), len);
}

/* The Column message of a packed job (count: its values; codec, delta, shuffle, data). */
static size_t column_size(const PackJob *j) {
    size_t n = varint_field_size((uint64_t)j->dtype_code);
    n += varint_field_size(j->packed.compressed ? CODEC_ZSTD : CODEC_NONE);
    n += varint_field_size((uint64_t)j->n);
    n += varint_field_size((uint64_t)j->delta);
    n += varint_field_size((uint64_t)(j->width > 1 && j->n > 1));
    if (j->packed.len) n += len_field_size(j->packed.len);
    return n;
}

static unsigned char *put_column(unsigned char *o, int field, const PackJob *j) {
    o = put_len_prefix(o, field, column_size(j));
    o = put_varint_field(o, COL_DTYPE, (uint64_t)j->dtype_code);
    o = put_varint_field(o, COL_CODEC, j->packed.compressed ? CODEC_ZSTD : CODEC_NONE);
    o = put_varint_field(o, COL_COUNT, (uint64_t)j->n);
    o = put_varint_field(o, COL_DELTA, (uint64_t)j->delta);
    o = put_varint_field(o, COL_SHUFFLE, (uint64_t)(j->width > 1 && j->n > 1));
    if (j->packed.len) {
        o = put_len_prefix(o, COL_DATA, j->packed.len);
        memcpy(o, j->packed.data, j->packed.len);
        o += j->packed.len;
    }
    return o;
}

/* Events or Flows: a count, then columns from field `first` on. */
static size_t table_size(uint64_t count, const PackJob *cols, Py_ssize_t n) {
    size_t size = varint_field_size(count);
    for (Py_ssize_t i = 0; i < n; i++) size += len_field_size(column_size(&cols[i]));
    return size;
}

static unsigned char *put_table(unsigned char *o, int field, uint64_t count, int first,
                                const PackJob *cols, Py_ssize_t n) {
    o = put_len_prefix(o, field, table_size(count, cols, n));
    o = put_varint_field(o, 1, count);
    for (Py_ssize_t i = 0; i < n; i++) o = put_column(o, first + (int)i, &cols[i]);
    return o;
}

typedef struct {
    const char *key;
    Py_ssize_t key_len;
    int type;
} AttrHead;

static size_t attr_size(const AttrHead *a, const PackJob *rows, const PackJob *values) {
    size_t n = a->key_len ? len_field_size((size_t)a->key_len) : 0;
    n += varint_field_size((uint64_t)a->type);
    return n + len_field_size(column_size(rows)) + len_field_size(column_size(values));
}

/* (count, [column, ...]) into jobs[at:]: the number of columns, or -1. */
static Py_ssize_t parse_table(PyObject *table, uint64_t *count, PackJob *jobs, Py_ssize_t room,
                              Py_ssize_t min_bytes, Py_ssize_t probe_values) {
    PyObject *cols;
    unsigned long long c;
    if (!PyTuple_Check(table) || !PyArg_ParseTuple(table, "KO!", &c, &PyList_Type, &cols)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a table is (count, [column, ...])");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(cols);
    if (n > room) {
        PyErr_SetString(PyExc_ValueError, "more columns than announced");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (parse_job(PyList_GET_ITEM(cols, i), &jobs[i], min_bytes, probe_values, 1)) return -1;
    *count = c;
    return n;
}

static Py_ssize_t table_columns(PyObject *table) {
    if (table == Py_None) return 0;
    if (!PyTuple_Check(table) || PyTuple_GET_SIZE(table) != 2 ||
        !PyList_Check(PyTuple_GET_ITEM(table, 1))) {
        PyErr_SetString(PyExc_TypeError, "a table is (count, [column, ...])");
        return -1;
    }
    return PyList_GET_SIZE(PyTuple_GET_ITEM(table, 1));
}

static PyObject *pack_step(PyObject *self, PyObject *args) {
    PyObject *events, *attrs, *flows;
    Py_buffer strings = {0};
    Py_ssize_t min_bytes, probe_values;
    int level;
    if (!PyArg_ParseTuple(args, "OO!Oy*nni", &events, &PyList_Type, &attrs, &flows, &strings,
                          &min_bytes, &probe_values, &level))
        return NULL;
    PyObject *result = NULL;
    PackJob *jobs = NULL;
    AttrHead *heads = NULL;
    unsigned char *frag = NULL;
    Scratch sc = {{NULL, 0}, {NULL, 0}, {{NULL, 0}, {NULL, 0}}};
    Packed strings_packed = {NULL, 0, 0};
    Py_ssize_t n_ev = table_columns(events), n_fl = table_columns(flows);
    Py_ssize_t n_attrs = PyList_GET_SIZE(attrs), count = 0;
    if (n_ev < 0 || n_fl < 0) goto done;
    if (events == Py_None) {
        PyErr_SetString(PyExc_TypeError, "a step has an events table");
        goto done;
    }
    if (check_bound() || check_sizes(min_bytes, probe_values)) goto done;
    count = n_ev + 2 * n_attrs + n_fl;
    jobs = calloc(count ? count : 1, sizeof(PackJob));
    heads = calloc(n_attrs ? n_attrs : 1, sizeof(AttrHead));
    if (!jobs || !heads) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t ev_count = 0, fl_count = 0;
    PackJob *ev = jobs, *at = jobs + n_ev, *fl = jobs + n_ev + 2 * n_attrs;
    if (parse_table(events, &ev_count, ev, n_ev, min_bytes, probe_values) < 0) goto done;
    for (Py_ssize_t i = 0; i < n_attrs; i++) {
        PyObject *item = PyList_GET_ITEM(attrs, i), *rows, *values;
        if (!PyTuple_Check(item) ||
            !PyArg_ParseTuple(item, "y#iOO", &heads[i].key, &heads[i].key_len, &heads[i].type,
                              &rows, &values)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "an attribute is (key, type, rows, values)");
            goto done;
        }
        if (parse_job(rows, &at[2 * i], min_bytes, probe_values, 1) ||
            parse_job(values, &at[2 * i + 1], min_bytes, probe_values, 1))
            goto done;
    }
    if (flows != Py_None && parse_table(flows, &fl_count, fl, n_fl, min_bytes, probe_values) < 0)
        goto done;

    Packer p = {NULL, (size_t)min_bytes, NULL};
    int failed;
    size_t frag_len = 0;
    Py_BEGIN_ALLOW_THREADS
    failed = pack_jobs(&p, jobs, count, probe_values, level, &sc);
    if (!failed) { /* the string table: one plain byte column */
        Packed form;
        failed = pack_form(&p, &sc, 0, strings.buf, (size_t)strings.len, &form) ||
                 keep(&p, &form, &strings_packed);
    }
    if (!failed) {
        size_t ev_size = table_size(ev_count, ev, n_ev);
        frag_len = len_field_size(ev_size);
        for (Py_ssize_t i = 0; i < n_attrs; i++)
            frag_len += len_field_size(attr_size(&heads[i], &at[2 * i], &at[2 * i + 1]));
        if (flows != Py_None) frag_len += len_field_size(table_size(fl_count, fl, n_fl));
        frag = malloc(frag_len ? frag_len : 1);
        if (!frag) {
            p.error = "memory";
            failed = 1;
        } else {
            unsigned char *o = put_table(frag, STEP_EVENTS, ev_count, EVENTS_FIRST_COLUMN, ev, n_ev);
            for (Py_ssize_t i = 0; i < n_attrs; i++) {
                const AttrHead *a = &heads[i];
                o = put_len_prefix(o, STEP_ATTRS, attr_size(a, &at[2 * i], &at[2 * i + 1]));
                if (a->key_len) {
                    o = put_len_prefix(o, ATTR_KEY, (size_t)a->key_len);
                    memcpy(o, a->key, (size_t)a->key_len);
                    o += a->key_len;
                }
                o = put_varint_field(o, ATTR_TYPE, (uint64_t)a->type);
                o = put_column(o, ATTR_ROWS, &at[2 * i]);
                o = put_column(o, ATTR_VALUES, &at[2 * i + 1]);
            }
            if (flows != Py_None)
                o = put_table(o, STEP_FLOWS, fl_count, FLOWS_FIRST_COLUMN, fl, n_fl);
            if ((size_t)(o - frag) != frag_len) {
                p.error = "the fragment's size was miscounted";
                failed = 1;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        raise_pack_error(&p, "pack_step");
        goto done;
    }
    result = Py_BuildValue("(Oy#y#)", strings_packed.compressed ? Py_True : Py_False,
                           (const char *)(strings_packed.data ? strings_packed.data
                                                              : (unsigned char *)""),
                           (Py_ssize_t)strings_packed.len, (const char *)frag,
                           (Py_ssize_t)frag_len);

done:
    for (Py_ssize_t i = 0; i < count; i++) {
        if (jobs[i].held) PyBuffer_Release(&jobs[i].view);
        free(jobs[i].packed.data);
    }
    free(jobs);
    free(heads);
    free_scratch(&sc);
    free(frag);
    free(strings_packed.data);
    PyBuffer_Release(&strings);
    return result;
}
#endif /* COLPACK_ZSTD */

/* ---- in_canonical_order: step.canonical_order's check, one pass without the GIL --------
 *
 * in_canonical_order(track, start, dur, external) -> bool: whether consecutive rows are
 * non-decreasing by (track, start, -dur, external), as step._in_order finds with numpy
 * (-dur wrapping like numpy's negative). track int32, the others int64, all of one length.
 * Steps come from the importer in that order; the numpy check cost a step of the 50x copy
 * some 0.15 ms of GIL-held calls. */
static PyObject *in_canonical_order(PyObject *self, PyObject *args) {
    Py_buffer b[4];
    const int widths[4] = {4, 8, 8, 8};
    int held = 0, ok = 1;
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    for (; held < 4; held++) {
        if (PyObject_GetBuffer(objs[held], &b[held], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            ok = -1;
            break;
        }
        if (b[held].itemsize != widths[held] || b[held].len / widths[held] != b[0].len / 4) {
            PyErr_SetString(PyExc_ValueError, "track int32, start, dur and external int64, "
                                              "of one length");
            held++;
            ok = -1;
            break;
        }
    }
    if (ok == 1) {
        Py_ssize_t n = b[0].len / 4;
        const int32_t *track = b[0].buf;
        const int64_t *start = b[1].buf, *dur = b[2].buf, *ext = b[3].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 1; i < n; i++) {
            if (track[i] != track[i - 1]) {
                if (track[i] < track[i - 1]) { ok = 0; break; }
                continue;
            }
            if (start[i] != start[i - 1]) {
                if (start[i] < start[i - 1]) { ok = 0; break; }
                continue;
            }
            int64_t a = (int64_t)(0 - (uint64_t)dur[i - 1]), c = (int64_t)(0 - (uint64_t)dur[i]);
            if (c != a) {
                if (c < a) { ok = 0; break; }
                continue;
            }
            if (ext[i] < ext[i - 1]) { ok = 0; break; }
        }
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < held; i++) PyBuffer_Release(&b[i]);
    if (ok < 0) return NULL;
    return PyBool_FromLong(ok);
}

/* union_length(starts, ends, lo, hi) -> int: the length of the union of the intervals
 * [starts[i], ends[i]) (int64 each) clipped to [lo, hi): backend/intervals.union_length_ns,
 * whose numpy form takes some twenty calls (an importer asks it for every step's GPU busy
 * %). The clipped intervals are sorted by start (a radix sort of their offsets from lo,
 * eight bits at a time, as many passes as the offsets have bytes) and swept once. Small
 * inputs, so the GIL is kept. */
static PyObject *union_length(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer sb, eb;
    long long lo, hi;
    if (!PyArg_ParseTuple(args, "y*y*LL", &sb, &eb, &lo, &hi)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = sb.len / 8;
    uint64_t *buf = NULL;
    if (sb.len != eb.len || sb.len % 8) {
        PyErr_SetString(PyExc_ValueError, "union_length: starts and ends are int64 of one length");
        goto done;
    }
    /* offsets from lo of the kept intervals' starts and ends, and room to sort them */
    buf = malloc((size_t)(n ? n : 1) * 4 * sizeof(uint64_t));
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t *key = buf, *end = buf + n, *key2 = buf + 2 * n, *end2 = buf + 3 * n;
    const int64_t *starts = sb.buf, *ends = eb.buf;
    Py_ssize_t m = 0;
    uint64_t top = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* raised to lo, then lowered to hi, as the numpy form clips: with lo past hi
         * every interval is empty, a reversed one too */
        int64_t a = starts[i] < lo ? lo : starts[i], b = ends[i] < lo ? lo : ends[i];
        if (a > hi) a = hi;
        if (b > hi) b = hi;
        if (b <= a) continue;
        key[m] = (uint64_t)a - (uint64_t)lo;
        end[m] = (uint64_t)b - (uint64_t)lo;
        top |= key[m++];
    }
    for (int shift = 0; shift < 64 && (top >> shift); shift += 8) {
        size_t count[257] = {0};
        for (Py_ssize_t i = 0; i < m; i++) count[((key[i] >> shift) & 0xFF) + 1]++;
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (Py_ssize_t i = 0; i < m; i++) {
            size_t at = count[(key[i] >> shift) & 0xFF]++;
            key2[at] = key[i];
            end2[at] = end[i];
        }
        uint64_t *t = key;
        key = key2, key2 = t;
        t = end, end = end2, end2 = t;
    }
    uint64_t total = 0;
    if (m) {
        uint64_t from = key[0], reach = end[0];
        for (Py_ssize_t i = 1; i < m; i++) {
            if (key[i] > reach) { /* a gap: the segment so far ends */
                total += reach - from;
                from = key[i];
                reach = end[i];
            } else if (end[i] > reach) {
                reach = end[i];
            }
        }
        total += reach - from;
    }
    result = PyLong_FromUnsignedLongLong(total);
done:
    free(buf);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&eb);
    return result;
}

static PyMethodDef methods[] = {
    {"in_canonical_order", in_canonical_order, METH_VARARGS,
     "in_canonical_order(track, start, dur, external) -> bool"},
    {"union_length", union_length, METH_VARARGS,
     "union_length(starts, ends, lo, hi) -> int: the length of the union of the int64 "
     "intervals [starts, ends) clipped to [lo, hi)"},
    {"layout_columns", layout_columns, METH_VARARGS,
     "layout_columns(jobs, min_bytes, probe_values) -> [(shuffle, plain, diffs, probes)]"},
#if COLPACK_ZSTD
    {"bind_zstd", bind_zstd, METH_VARARGS,
     "bind_zstd(path, version) -> bool: take Zstandard's functions from the library at path"},
    {"pack_columns", pack_columns, METH_VARARGS,
     "pack_columns(jobs, min_bytes, probe_values, level) -> [(delta, shuffle, compressed, "
     "bytes)]"},
    {"pack_step", pack_step, METH_VARARGS,
     "pack_step(events, attrs, flows, strings_json, min_bytes, probe_values, level) -> "
     "(strings_compressed, strings_data, fragment)"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_colpack", "A step's columns laid out in C (trace/columns.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__colpack(void) {
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) {
        /* Columns are little-endian; columns.py lays them out itself on other machines. */
        PyErr_SetString(PyExc_ImportError, "_colpack lays out on little-endian machines only");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
#if COLPACK_ZSTD
    if (m) {
        PyObject *schema =
            Py_BuildValue("(iii)(ii)(iiii)(ii)(iiiiii)(ii)", STEP_EVENTS, STEP_ATTRS, STEP_FLOWS,
                          EVENTS_COUNT, EVENTS_FIRST_COLUMN, ATTR_KEY, ATTR_TYPE, ATTR_ROWS,
                          ATTR_VALUES, FLOWS_COUNT, FLOWS_FIRST_COLUMN, COL_DTYPE, COL_CODEC,
                          COL_COUNT, COL_DELTA, COL_SHUFFLE, COL_DATA, CODEC_NONE, CODEC_ZSTD);
        if (!schema || PyModule_AddObject(m, "STEP_SCHEMA", schema) < 0) {
            Py_XDECREF(schema);
            Py_DECREF(m);
            return NULL;
        }
    }
#endif
    return m;
}
