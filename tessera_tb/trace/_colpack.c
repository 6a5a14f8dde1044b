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

typedef struct {
    Py_buffer view;
    int held;
    Py_ssize_t n;
    int width;
    int mode;
    Py_ssize_t starts[MAX_PROBES]; /* probe blocks' first values, for a long column's choice */
    Py_ssize_t n_starts;
    /* result: bytes objects made with the GIL, filled without it */
    PyObject *plain, *diffs;
    PyObject *probes[MAX_PROBES][2];
} Job;

/* Differences from the previous value, the first from 0, wrapping like numpy's subtract:
 * unsigned arithmetic of the values' width (memcpy: the values need not be aligned). */
#define DIFFERENCES(type)                                  \
    do {                                                   \
        type prev = 0, v, d;                               \
        for (Py_ssize_t i = 0; i < n; i++) {               \
            memcpy(&v, src + sizeof(type) * i, sizeof v);  \
            d = (type)(v - prev);                          \
            memcpy(dst + sizeof(type) * i, &d, sizeof d);  \
            prev = v;                                      \
        }                                                  \
    } while (0)

static void differences(const unsigned char *src, unsigned char *dst, Py_ssize_t n, int width) {
    switch (width) {
    case 1: DIFFERENCES(uint8_t); break;
    case 2: DIFFERENCES(uint16_t); break;
    case 4: DIFFERENCES(uint32_t); break;
    default: DIFFERENCES(uint64_t); break;
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
    size_t need = (size_t)j->n * (size_t)j->width;
    if (j->n_starts && (size_t)probe_values * (size_t)j->width > need)
        need = (size_t)probe_values * (size_t)j->width;
    if (j->diffs && need > *cap) {
        unsigned char *q = realloc(*scratch, need);
        if (!q) return -1;
        *scratch = q;
        *cap = need;
    }
    const unsigned char *src = j->view.buf;
    for (Py_ssize_t b = 0; b < j->n_starts; b++)
        lay_out(src + (size_t)j->starts[b] * j->width, probe_values, j->width, j->probes[b][0],
                j->probes[b][1], *scratch);
    lay_out(src, j->n, j->width, j->plain, j->diffs, *scratch);
    return 0;
}

static PyObject *new_bytes(Py_ssize_t n) { return PyBytes_FromStringAndSize(NULL, n); }

static PyObject *job_result(Job *j) {
    int shuffle = j->width > 1 && j->n > 1;
    PyObject *probes = Py_None;
    Py_INCREF(Py_None);
    if (j->n_starts) {
        Py_DECREF(Py_None);
        probes = PyTuple_New(j->n_starts);
        if (!probes) return NULL;
        for (Py_ssize_t b = 0; b < j->n_starts; b++) {
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
    if (min_bytes < 0 || probe_values < 1) {
        PyErr_SetString(PyExc_ValueError, "min_bytes and probe_values must be positive");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(jobs_obj);
    Job *jobs = calloc(count ? count : 1, sizeof(Job));
    if (!jobs) return PyErr_NoMemory();
    PyObject *result = NULL;
    unsigned char *scratch = NULL;
    size_t scratch_cap = 0;

    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(jobs_obj, i);
        PyObject *arr, *starts = Py_None;
        int mode;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "Oi|O", &arr, &mode, &starts)) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "each job is (array, mode[, starts])");
            goto done;
        }
        Job *j = &jobs[i];
        if (PyObject_GetBuffer(arr, &j->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        j->held = 1;
        int w = (int)j->view.itemsize;
        if (w != 1 && w != 2 && w != 4 && w != 8) {
            PyErr_Format(PyExc_ValueError, "values of %d bytes cannot be packed", w);
            goto done;
        }
        if (mode < MODE_PLAIN || mode > MODE_CHOOSE) {
            PyErr_Format(PyExc_ValueError, "unknown mode %d", mode);
            goto done;
        }
        j->width = w;
        j->n = j->view.len / w;
        j->mode = mode;
        /* columns._layout: which forms are wanted */
        int choose = mode == MODE_CHOOSE && j->n > 2 && j->view.len >= min_bytes;
        int delta_only = mode == MODE_DELTA && j->n > 0;
        if (choose && starts != Py_None) {
            if (!PyTuple_Check(starts) || PyTuple_GET_SIZE(starts) > MAX_PROBES) {
                PyErr_Format(PyExc_TypeError, "probe starts: a tuple of at most %d ints", MAX_PROBES);
                goto done;
            }
            j->n_starts = PyTuple_GET_SIZE(starts);
            for (Py_ssize_t b = 0; b < j->n_starts; b++) {
                Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(starts, b));
                if (s == -1 && PyErr_Occurred()) goto done;
                if (s < 0 || s + probe_values > j->n) {
                    PyErr_Format(PyExc_ValueError, "probe block at %zd is outside the column", s);
                    goto done;
                }
                j->starts[b] = s;
                if (!(j->probes[b][0] = new_bytes(probe_values * w))) goto done;
                if (!(j->probes[b][1] = new_bytes(probe_values * w))) goto done;
            }
        }
        if (!delta_only && !(j->plain = new_bytes(j->view.len))) goto done;
        if ((delta_only || choose) && !(j->diffs = new_bytes(j->view.len))) goto done;
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

    result = PyList_New(count);
    if (!result) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = job_result(&jobs[i]);
        if (!t) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, t);
    }

done:
    for (Py_ssize_t i = 0; i < count; i++) {
        Job *j = &jobs[i];
        if (j->held) PyBuffer_Release(&j->view);
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

/* ---- pack_columns: layout, Zstandard and the choice of form in one call, no GIL ----------
 *
 * What columns._pack_all does with the laid-out forms, here in C: each wanted form is
 * compressed (a form of at least min_bytes, kept compressed where that is smaller), a column
 * with both forms keeps the smaller (the plain one on a tie), and a long column that chooses
 * does so on its probe blocks, then compresses only the chosen form. With the layout in
 * Python's hands, a step cost ~1.2 ms of GIL-held work between the C calls (lists of forms,
 * the batch call's segments, the choice); steps encoded in two threads queued for it.
 *
 * Zstandard is the one the zstandard package was built with: bind_zstd(path) loads the
 * package's own library (its CFFI module exports Zstandard's functions) and takes the
 * functions from it, so the frames are the package's, byte for byte. The bound version must
 * equal the one the package reports, or nothing is bound and Python packs as before.
 *
 * pack_columns(jobs, min_bytes, probe_values, level) -> list
 *   jobs as layout_columns'. Returns one (delta, shuffle, compressed, bytes) per job.
 */
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

/* One form's stored bytes: compressed where it is at least min_bytes long and that makes it
 * smaller, else the form itself. `form` is taken (kept as the result or freed). */
typedef struct {
    unsigned char *data;
    size_t len;
    int compressed;
} Packed;

typedef struct {
    ZSTD_CCtx *cctx;
    size_t min_bytes;
    const char *error; /* a Zstandard error's name, or "memory" */
} Packer;

static int pack_form(Packer *p, unsigned char *form, size_t len, Packed *out) {
    out->data = form;
    out->len = len;
    out->compressed = 0;
    if (len < p->min_bytes) return 0;
    size_t cap = Z.compressBound(len);
    unsigned char *z = malloc(cap ? cap : 1);
    if (!z) {
        p->error = "memory";
        return -1;
    }
    size_t made = Z.compress2(p->cctx, z, cap, form, len);
    if (Z.isError(made)) {
        p->error = Z.getErrorName(made);
        free(z);
        return -1;
    }
    if (made < len) {
        free(form);
        unsigned char *fit = realloc(z, made ? made : 1);
        out->data = fit ? fit : z;
        out->len = made;
        out->compressed = 1;
    } else {
        free(z);
    }
    return 0;
}

/* The size a form packs to (for the probe blocks' choice), the form left as it is. */
static int packed_size(Packer *p, const unsigned char *form, size_t len, size_t *size,
                       unsigned char **zbuf, size_t *zcap) {
    *size = len;
    if (len < p->min_bytes) return 0;
    size_t cap = Z.compressBound(len);
    if (cap > *zcap) {
        unsigned char *q = realloc(*zbuf, cap);
        if (!q) {
            p->error = "memory";
            return -1;
        }
        *zbuf = q;
        *zcap = cap;
    }
    size_t made = Z.compress2(p->cctx, *zbuf, cap, form, len);
    if (Z.isError(made)) {
        p->error = Z.getErrorName(made);
        return -1;
    }
    if (made < len) *size = made;
    return 0;
}

typedef struct {
    Py_buffer view;
    int held;
    Py_ssize_t n;
    int width, mode, choose, delta_only;
    Py_ssize_t starts[MAX_PROBES];
    Py_ssize_t n_starts;
    int delta;
    Packed packed;
} PackJob;

/* A form of n values at src laid out into a new buffer: their planes, or those of their
 * differences (scratch: room for n values). */
static unsigned char *laid_out(const unsigned char *src, Py_ssize_t n, int w, int diffs,
                               unsigned char *scratch) {
    size_t len = (size_t)n * (size_t)w;
    unsigned char *out = malloc(len ? len : 1);
    if (!out) return NULL;
    if (diffs) {
        differences(src, scratch, n, w);
        split_planes(scratch, out, n, w);
    } else {
        split_planes(src, out, n, w);
    }
    return out;
}

static int pack_job(Packer *p, PackJob *j, Py_ssize_t probe_values, unsigned char **scratch,
                    size_t *cap, unsigned char **zbuf, size_t *zcap) {
    int w = j->width;
    size_t len = (size_t)j->n * (size_t)w;
    size_t need = len;
    if (j->n_starts && (size_t)probe_values * (size_t)w > need) need = (size_t)probe_values * w;
    if (need > *cap) {
        unsigned char *q = realloc(*scratch, need);
        if (!q) {
            p->error = "memory";
            return -1;
        }
        *scratch = q;
        *cap = need;
    }
    const unsigned char *src = j->view.buf;
    if (j->n_starts) {
        /* columns._pack_all: the probe blocks' packed sizes, summed per form */
        size_t sums[2] = {0, 0};
        for (Py_ssize_t b = 0; b < j->n_starts; b++) {
            for (int d = 0; d < 2; d++) {
                unsigned char *form =
                    laid_out(src + (size_t)j->starts[b] * w, probe_values, w, d, *scratch);
                if (!form) {
                    p->error = "memory";
                    return -1;
                }
                size_t size;
                int bad = packed_size(p, form, (size_t)probe_values * w, &size, zbuf, zcap);
                free(form);
                if (bad) return -1;
                sums[d] += size;
            }
        }
        j->delta = sums[1] < sums[0];
        unsigned char *form = laid_out(src, j->n, w, j->delta, *scratch);
        if (!form) {
            p->error = "memory";
            return -1;
        }
        return pack_form(p, form, len, &j->packed);
    }
    Packed as_is = {NULL, 0, 0}, as_diffs = {NULL, 0, 0};
    int has_plain = !j->delta_only, has_diffs = j->delta_only || j->choose;
    if (has_plain) {
        unsigned char *form = laid_out(src, j->n, w, 0, *scratch);
        if (!form) {
            p->error = "memory";
            return -1;
        }
        if (pack_form(p, form, len, &as_is)) return -1;
    }
    if (has_diffs) {
        unsigned char *form = laid_out(src, j->n, w, 1, *scratch);
        if (!form) {
            p->error = "memory";
            free(as_is.data);
            return -1;
        }
        if (pack_form(p, form, len, &as_diffs)) {
            free(as_is.data);
            return -1;
        }
    }
    if (has_diffs && (!has_plain || as_diffs.len < as_is.len)) {
        j->delta = 1;
        j->packed = as_diffs;
        free(as_is.data);
    } else {
        j->delta = 0;
        j->packed = as_is;
        free(as_diffs.data);
    }
    return 0;
}

static PyObject *pack_columns(PyObject *self, PyObject *args) {
    PyObject *jobs_obj;
    Py_ssize_t min_bytes, probe_values;
    int level;
    if (!PyArg_ParseTuple(args, "O!nni", &PyList_Type, &jobs_obj, &min_bytes, &probe_values,
                          &level))
        return NULL;
    if (!z_bound) {
        PyErr_SetString(PyExc_RuntimeError, "no Zstandard bound (bind_zstd)");
        return NULL;
    }
    if (min_bytes < 0 || probe_values < 1) {
        PyErr_SetString(PyExc_ValueError, "min_bytes and probe_values must be positive");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(jobs_obj);
    PackJob *jobs = calloc(count ? count : 1, sizeof(PackJob));
    if (!jobs) return PyErr_NoMemory();
    PyObject *result = NULL;
    unsigned char *scratch = NULL, *zbuf = NULL;
    size_t scratch_cap = 0, zcap = 0;

    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(jobs_obj, i);
        PyObject *arr, *starts = Py_None;
        int mode;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "Oi|O", &arr, &mode, &starts)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "each job is (array, mode[, starts])");
            goto done;
        }
        PackJob *j = &jobs[i];
        if (PyObject_GetBuffer(arr, &j->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
        j->held = 1;
        int w = (int)j->view.itemsize;
        if (w != 1 && w != 2 && w != 4 && w != 8) {
            PyErr_Format(PyExc_ValueError, "values of %d bytes cannot be packed", w);
            goto done;
        }
        if (mode < MODE_PLAIN || mode > MODE_CHOOSE) {
            PyErr_Format(PyExc_ValueError, "unknown mode %d", mode);
            goto done;
        }
        j->width = w;
        j->n = j->view.len / w;
        j->mode = mode;
        j->choose = mode == MODE_CHOOSE && j->n > 2 && j->view.len >= min_bytes;
        j->delta_only = mode == MODE_DELTA && j->n > 0;
        if (j->choose && starts != Py_None) {
            if (!PyTuple_Check(starts) || PyTuple_GET_SIZE(starts) > MAX_PROBES) {
                PyErr_Format(PyExc_TypeError, "probe starts: a tuple of at most %d ints",
                             MAX_PROBES);
                goto done;
            }
            j->n_starts = PyTuple_GET_SIZE(starts);
            for (Py_ssize_t b = 0; b < j->n_starts; b++) {
                Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(starts, b));
                if (s == -1 && PyErr_Occurred()) goto done;
                if (s < 0 || s + probe_values > j->n) {
                    PyErr_Format(PyExc_ValueError, "probe block at %zd is outside the column", s);
                    goto done;
                }
                j->starts[b] = s;
            }
        }
    }

    Packer p = {NULL, (size_t)min_bytes, NULL};
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    p.cctx = thread_cctx(level);
    if (!p.cctx) {
        p.error = "no compression context";
        failed = 1;
    }
    for (Py_ssize_t i = 0; i < count && !failed; i++)
        failed = pack_job(&p, &jobs[i], probe_values, &scratch, &scratch_cap, &zbuf, &zcap) != 0;
    Py_END_ALLOW_THREADS
    if (failed) {
        if (p.error && strcmp(p.error, "memory") == 0)
            PyErr_NoMemory();
        else
            PyErr_Format(PyExc_RuntimeError, "Zstandard: %s", p.error ? p.error : "failed");
        goto done;
    }

    result = PyList_New(count);
    if (!result) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        PackJob *j = &jobs[i];
        int shuffle = j->width > 1 && j->n > 1;
        PyObject *t = Py_BuildValue("(OOOy#)", j->delta ? Py_True : Py_False,
                                    shuffle ? Py_True : Py_False,
                                    j->packed.compressed ? Py_True : Py_False,
                                    (const char *)(j->packed.data ? j->packed.data
                                                                  : (unsigned char *)""),
                                    (Py_ssize_t)j->packed.len);
        if (!t) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, t);
    }

done:
    for (Py_ssize_t i = 0; i < count; i++) {
        if (jobs[i].held) PyBuffer_Release(&jobs[i].view);
        free(jobs[i].packed.data);
    }
    free(jobs);
    free(scratch);
    free(zbuf);
    return result;
}
#endif /* COLPACK_ZSTD */

static PyMethodDef methods[] = {
    {"layout_columns", layout_columns, METH_VARARGS,
     "layout_columns(jobs, min_bytes, probe_values) -> [(shuffle, plain, diffs, probes)]"},
#if COLPACK_ZSTD
    {"bind_zstd", bind_zstd, METH_VARARGS,
     "bind_zstd(path, version) -> bool: take Zstandard's functions from the library at path"},
    {"pack_columns", pack_columns, METH_VARARGS,
     "pack_columns(jobs, min_bytes, probe_values, level) -> [(delta, shuffle, compressed, "
     "bytes)]"},
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
    return PyModule_Create(&module);
}
