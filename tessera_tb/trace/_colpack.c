/* Pack a step's columns in C: difference coding, byte planes and zlib, the GIL released.
 *
 * columns.encode_many does, per column, what columns._pack_column does with numpy and the
 * zlib module: the values' differences (or not), their bytes split into planes (the first
 * byte of every value, then the second, ...), then zlib at the given level when that makes
 * the column smaller. Where difference coding is left to choose, both forms are packed and the
 * smaller kept; a long column chooses on a few probe blocks instead (columns._delta_pays).
 * The bytes are the Python path's, byte for byte (the same zlib, deflateInit2 with the
 * zlib module's parameters; tests/trace/test_colpack.py compares them on real steps).
 *
 * In Python every column costs a dozen numpy and zlib calls, each taking the GIL back; an
 * importer encodes steps in several threads, which then queue for the GIL between calls.
 * Here a whole step's columns are packed in one call that holds the GIL only to read the
 * arguments and make the result.
 *
 * pack_columns(jobs, level, min_bytes, probe_values) -> list
 *   jobs: list of (array, mode[, starts]): a C-contiguous little-endian buffer of 1, 2, 4 or
 *   8-byte values; mode 0 plain, 1 differences, 2 choose (integers only); starts, for a long
 *   column that chooses: the first value of each probe block of probe_values values.
 *   Returns one (delta, shuffle, compressed, data) tuple per job.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

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
    /* result */
    int delta, shuffle, compressed;
    unsigned char *data; /* malloc'd, or NULL when the result is the input's bytes */
    size_t len;
} Job;

typedef struct {
    z_stream z;
    int ready;
    int level;
    size_t min_bytes;
    /* scratch, grown as needed */
    unsigned char *diff, *planes, *zout;
    size_t diff_cap, planes_cap, zout_cap;
} Packer;

static int grow(unsigned char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    unsigned char *q = realloc(*p, c);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

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

/* Byte planes: plane b holds byte b of every value. */
static void split_planes(const unsigned char *src, unsigned char *dst, Py_ssize_t n, int width) {
    if (width == 8) {
        for (Py_ssize_t i = 0; i < n; i++) {
            const unsigned char *v = src + 8 * i;
            dst[i] = v[0];
            dst[n + i] = v[1];
            dst[2 * n + i] = v[2];
            dst[3 * n + i] = v[3];
            dst[4 * n + i] = v[4];
            dst[5 * n + i] = v[5];
            dst[6 * n + i] = v[6];
            dst[7 * n + i] = v[7];
        }
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        for (int b = 0; b < width; b++) dst[(Py_ssize_t)b * n + i] = src[i * width + b];
}

/* zlib into p->zout; returns its length, 0 when zlib does not make `len` bytes smaller
 * (or they are too few to try), -1 on error. */
static long deflate_into(Packer *p, const unsigned char *src, size_t len) {
    if (len < p->min_bytes) return 0;
    if (len > 0xFFFFFFF0u) return -1; /* one deflate call takes at most 4 GB */
    if (!p->ready) {
        memset(&p->z, 0, sizeof p->z);
        /* The zlib module's compress(): wbits 15, memLevel 8, the default strategy. */
        if (deflateInit2(&p->z, p->level, Z_DEFLATED, MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
            return -1;
        p->ready = 1;
    } else if (deflateReset(&p->z) != Z_OK) {
        return -1;
    }
    size_t bound = deflateBound(&p->z, (uLong)len);
    if (grow(&p->zout, &p->zout_cap, bound)) return -1;
    p->z.next_in = (Bytef *)src;
    p->z.avail_in = (uInt)len;
    p->z.next_out = p->zout;
    p->z.avail_out = (uInt)bound;
    if (deflate(&p->z, Z_FINISH) != Z_STREAM_END) return -1;
    size_t out = p->z.total_out;
    return out < len ? (long)out : 0;
}

/* Pack n values at src: planes, then zlib. On return *data points at the packed bytes (a
 * scratch buffer of p, or src itself), valid until the next call. */
static int pack(Packer *p, const unsigned char *src, Py_ssize_t n, int width, int *shuffle,
                int *compressed, const unsigned char **data, size_t *len) {
    size_t nbytes = (size_t)n * (size_t)width;
    const unsigned char *bytes = src;
    *shuffle = width > 1 && n > 1;
    if (*shuffle) {
        if (grow(&p->planes, &p->planes_cap, nbytes)) return -1;
        split_planes(src, p->planes, n, width);
        bytes = p->planes;
    }
    long z = deflate_into(p, bytes, nbytes);
    if (z < 0) return -1;
    *compressed = z > 0;
    *data = z > 0 ? p->zout : bytes;
    *len = z > 0 ? (size_t)z : nbytes;
    return 0;
}

static size_t packed_len(Packer *p, const unsigned char *src, Py_ssize_t n, int width, int *err) {
    int s, c;
    const unsigned char *d;
    size_t len = 0;
    if (pack(p, src, n, width, &s, &c, &d, &len)) *err = 1;
    return len;
}

static int keep(Job *j, const unsigned char *data, size_t len) {
    j->data = malloc(len ? len : 1);
    if (!j->data) return -1;
    memcpy(j->data, data, len);
    j->len = len;
    return 0;
}

static int run_job(Packer *p, Job *j, Py_ssize_t probe_values) {
    const unsigned char *src = j->view.buf;
    Py_ssize_t n = j->n;
    int w = j->width;
    size_t nbytes = (size_t)n * (size_t)w;
    int delta = j->mode == MODE_DELTA && n > 0;
    int err = 0;

    if (j->mode == MODE_CHOOSE && n > 2 && nbytes >= p->min_bytes) {
        if (grow(&p->diff, &p->diff_cap, nbytes)) return -1;
        if (j->n_starts) {
            /* columns._delta_pays: blocks of probe_values at the starts given */
            size_t plain = 0, diffs = 0;
            for (Py_ssize_t b = 0; b < j->n_starts; b++) {
                const unsigned char *block = src + (size_t)j->starts[b] * w;
                plain += packed_len(p, block, probe_values, w, &err);
                differences(block, p->diff, probe_values, w);
                diffs += packed_len(p, p->diff, probe_values, w, &err);
            }
            if (err) return -1;
            delta = diffs < plain;
        } else {
            /* Both forms whole, the smaller kept (the plain one on a tie). */
            int ps, pc, ds, dc;
            const unsigned char *d;
            size_t plain_len, diff_len;
            if (pack(p, src, n, w, &ps, &pc, &d, &plain_len) || keep(j, d, plain_len)) return -1;
            differences(src, p->diff, n, w);
            if (pack(p, p->diff, n, w, &ds, &dc, &d, &diff_len)) return -1;
            if (diff_len < plain_len) {
                free(j->data);
                j->data = NULL;
                j->delta = 1;
                j->shuffle = ds;
                j->compressed = dc;
                return keep(j, d, diff_len);
            }
            j->delta = 0;
            j->shuffle = ps;
            j->compressed = pc;
            return 0;
        }
    }
    const unsigned char *values = src;
    if (delta) {
        if (grow(&p->diff, &p->diff_cap, nbytes)) return -1;
        differences(src, p->diff, n, w);
        values = p->diff;
    }
    const unsigned char *d;
    size_t len;
    if (pack(p, values, n, w, &j->shuffle, &j->compressed, &d, &len)) return -1;
    j->delta = delta;
    return keep(j, d, len);
}

static PyObject *pack_columns(PyObject *self, PyObject *args) {
    PyObject *jobs_obj;
    int level;
    Py_ssize_t min_bytes, probe_values;
    if (!PyArg_ParseTuple(args, "O!inn", &PyList_Type, &jobs_obj, &level, &min_bytes, &probe_values))
        return NULL;
    if (min_bytes < 0 || probe_values < 1) {
        PyErr_SetString(PyExc_ValueError, "min_bytes and probe_values must be positive");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(jobs_obj);
    Job *jobs = calloc(count ? count : 1, sizeof(Job));
    if (!jobs) return PyErr_NoMemory();
    PyObject *result = NULL;
    Packer p = {0};
    p.level = level;
    p.min_bytes = (size_t)min_bytes;

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
        if (starts != Py_None) {
            if (!PyTuple_Check(starts) || PyTuple_GET_SIZE(starts) > MAX_PROBES) {
                PyErr_Format(PyExc_TypeError, "probe starts: a tuple of at most %d ints", MAX_PROBES);
                goto done;
            }
            j->n_starts = PyTuple_GET_SIZE(starts);
            for (Py_ssize_t b = 0; b < j->n_starts; b++) {
                Py_ssize_t s = PyLong_AsSsize_t(PyTuple_GET_ITEM(starts, b));
                if (s == -1 && PyErr_Occurred()) goto done;
                if (s < 0 || s + probe_values > j->view.len / w) {
                    PyErr_Format(PyExc_ValueError, "probe block at %zd is outside the column", s);
                    goto done;
                }
                j->starts[b] = s;
            }
        }
        j->width = w;
        j->n = j->view.len / w;
        j->mode = mode;
    }

    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count && !failed; i++)
        failed = run_job(&p, &jobs[i], probe_values) != 0;
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_MemoryError, "packing columns: out of memory or a zlib error");
        goto done;
    }

    result = PyList_New(count);
    if (!result) goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        Job *j = &jobs[i];
        PyObject *t = Py_BuildValue("(OOOy#)", j->delta ? Py_True : Py_False,
                                    j->shuffle ? Py_True : Py_False,
                                    j->compressed ? Py_True : Py_False, (const char *)j->data,
                                    (Py_ssize_t)j->len);
        if (!t) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, t);
    }

done:
    for (Py_ssize_t i = 0; i < count; i++) {
        if (jobs[i].held) PyBuffer_Release(&jobs[i].view);
        free(jobs[i].data);
    }
    free(jobs);
    if (p.ready) deflateEnd(&p.z);
    free(p.diff);
    free(p.planes);
    free(p.zout);
    return result;
}

static PyMethodDef methods[] = {
    {"pack_columns", pack_columns, METH_VARARGS,
     "pack_columns(jobs, level, min_bytes, probe_values) -> "
     "[(delta, shuffle, compressed, data)]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_colpack", "A step's columns packed in C (trace/columns.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__colpack(void) {
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) {
        /* Columns are little-endian; columns.py packs them itself on other machines. */
        PyErr_SetString(PyExc_ImportError, "_colpack packs on little-endian machines only");
        return NULL;
    }
    return PyModule_Create(&module);
}
