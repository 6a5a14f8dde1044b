/* Lay out a step's columns in C: difference coding and byte planes, the GIL released.
 *
 * columns.encode_many hands a step's columns here in one call; what comes back is what
 * columns._layout makes with numpy, byte for byte: each column's values split into byte
 * planes (the first byte of every value, then the second, ...), their differences laid out
 * the same way where they may be stored, and, for a long column that chooses between the
 * two, both forms of a few probe blocks. Python then compresses them with Zstandard (which
 * releases the GIL too) and keeps the smaller form (columns._finish).
 *
 * In Python every column costs several numpy calls, each taking the GIL back; an importer
 * encodes steps in several threads, which then queue for the GIL between calls. Here the
 * result's bytes objects are made first, then filled with the GIL released.
 *
 * layout_columns(jobs, min_bytes, probe_values) -> list
 *   jobs: list of (array, mode[, starts]): a C-contiguous little-endian buffer of 1, 2, 4 or
 *   8-byte values; mode 0 plain, 1 differences, 2 choose (integers only); starts, for a long
 *   column that chooses: the first value of each probe block of probe_values values.
 *   Returns one (shuffle, plain, diffs, probes) tuple per job: plain and diffs the laid-out
 *   bytes of the values and of their differences (None where that form is not wanted),
 *   probes None or a tuple of (plain, diffs) pairs, one per probe block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

static PyMethodDef methods[] = {
    {"layout_columns", layout_columns, METH_VARARGS,
     "layout_columns(jobs, min_bytes, probe_values) -> [(shuffle, plain, diffs, probes)]"},
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
