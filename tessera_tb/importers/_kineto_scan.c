/* One pass over a Kineto trace's JSON text, its `traceEvents` straight into columns.
 *
 * The pure-Python importer decodes every event into a Python object and then copies its
 * fields into numpy columns; on a 600k-event trace that is most of the import. This module
 * reads the JSON text once and writes the fields the importer keeps into flat arrays, with
 * every string interned once per file. It makes no Python object per event.
 *
 * It reads exactly what `kineto_decode.RawEvent` accepts (ph, cat, name: strings; pid, tid:
 * integer or string; ts, dur: number or null; id: integer, string or null; s, bp: strings;
 * args: object or null; any other key: any JSON value). Anything else, and the few valid
 * inputs it does not handle (a repeated key inside one `args`, nesting deeper than 512, a
 * number longer than 96 characters, a pid or tid beyond 64 bits), raises `Unsupported`: the
 * importer then takes the pure-Python path, which reads those or names the problem.
 *
 * scan_events(buffer) takes a whole trace: an object with a "traceEvents" list (every other
 * member is checked as JSON and left undecoded), or a bare list of events. It returns a dict:
 *   top        int64 (key string id, start, end) per other top-level member: its value's bytes
 *   events_range   (start, end) bytes of the events list
 *   n          number of events
 *   strings    list[str], the file's string table (index 0 is "")
 *   ph, cat, name, pid, tid   int32 string ids (pid/tid numbers as their decimal text)
 *   ts, dur    float64 microseconds, NaN when missing or null
 *   id_val     int64 flow id (0 when missing or null); id_sid int32 string id of a string id, else -1
 *   arg_ev, arg_type, arg_val: one row per argument (event index, type code, payload: int64
 *              value, float64 bits, or a string id), grouped by key (in event order within a
 *              key): the arguments of key k are rows arg_key_start[k] to arg_key_start[k + 1]
 *   arg_key_sid  int32 string id of each key; arg_key_start  int64, one more than the keys
 * Columns are bytearrays (native byte order), for numpy.frombuffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

/* Argument type codes (kineto_columns.py mirrors them). */
enum { T_NULL = 0, T_FALSE = 1, T_TRUE = 2, T_INT = 3, T_FLOAT = 4, T_STR = 5, T_RAW = 6, T_BIGINT = 7 };

/* For the few small functions of the hot path that the compiler would otherwise call. */
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

#define MAX_DEPTH 512
#define MAX_NUMBER_CHARS 96
#define MAX_SPACES 256 /* spaces skip_compact notes in a nested value */
#define MAX_ARGS_PER_EVENT 4096
#define KEY_MEMO 32

static PyObject *Unsupported;

/* ------------------------------------------------------------------ growable buffers */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (!n) return 0;
    if (buf_reserve(b, n)) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

#define PUT(buf, type, value)                       \
    do {                                            \
        type v_ = (value);                          \
        if (buf_put(&(buf), &v_, sizeof v_)) goto nomem; \
    } while (0)

/* ------------------------------------------------------------------ string interner */

#define RECENT_BITS 12
#define RECENT_SLOTS (1 << RECENT_BITS)

typedef struct {
    Buf arena;       /* the bytes of every distinct string */
    Buf offs;        /* size_t offset of string i in the arena */
    Buf lens;        /* size_t length of string i */
    int32_t *table;  /* open addressing: id + 1, 0 = empty */
    uint64_t *hashes;
    size_t mask;
    int32_t count;
    int32_t recent[RECENT_SLOTS]; /* a string id by quick_hash, -1 for none (see intern) */
} Interner;

/* The hash of s[0:n]: eight bytes at a time, the last few as one word of their own (read
 * without going past s + n). Only the interner's probe order depends on it: string ids are
 * numbered in first-use order whatever it is. */
static inline uint64_t hash_word(uint64_t h, uint64_t w) {
    h = (h ^ w) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)n;
    uint64_t w = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, s + i, 8);
        h = hash_word(h, w);
    }
    size_t rest = n - i;
    if (rest) {
        const char *t = s + i;
        if (n >= 8) {
            memcpy(&w, s + n - 8, 8); /* overlaps bytes already taken: still a function of s */
        } else if (rest >= 4) {
            uint32_t lo, hi;
            memcpy(&lo, t, 4);
            memcpy(&hi, t + rest - 4, 4);
            w = (uint64_t)lo | ((uint64_t)hi << 32);
        } else {
            w = (uint64_t)(unsigned char)t[0] | ((uint64_t)(unsigned char)t[rest / 2] << 8) |
                ((uint64_t)(unsigned char)t[rest - 1] << 16);
        }
        h = hash_word(h, w);
    }
    h ^= h >> 32;
    return h;
}

/* s[0:n] == t[0:n], for the short strings the interner mostly compares (no call): eight
 * bytes at a time, the last few as a word that overlaps the ones before. */
static inline int same_bytes(const char *s, const char *t, size_t n) {
    uint64_t a, b;
    if (n >= 8) {
        for (size_t i = 0; i + 8 < n; i += 8) {
            memcpy(&a, s + i, 8);
            memcpy(&b, t + i, 8);
            if (a != b) return 0;
        }
        memcpy(&a, s + n - 8, 8);
        memcpy(&b, t + n - 8, 8);
        return a == b;
    }
    if (n >= 4) {
        uint32_t x, y, u, v;
        memcpy(&x, s, 4);
        memcpy(&y, t, 4);
        memcpy(&u, s + n - 4, 4);
        memcpy(&v, t + n - 4, 4);
        return x == y && u == v;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i] != t[i]) return 0;
    return 1;
}

static int interner_init(Interner *in) {
    memset(in, 0, sizeof *in);
    memset(in->recent, 0xFF, sizeof in->recent);
    in->mask = 4096 - 1;
    in->table = calloc(in->mask + 1, sizeof(int32_t));
    in->hashes = calloc(in->mask + 1, sizeof(uint64_t));
    return (in->table && in->hashes) ? 0 : -1;
}

static void interner_free(Interner *in) {
    free(in->arena.p);
    free(in->offs.p);
    free(in->lens.p);
    free(in->table);
    free(in->hashes);
}

static int interner_grow(Interner *in) {
    size_t size = (in->mask + 1) * 2;
    int32_t *table = calloc(size, sizeof(int32_t));
    uint64_t *hashes = calloc(size, sizeof(uint64_t));
    if (!table || !hashes) {
        free(table);
        free(hashes);
        return -1;
    }
    for (size_t i = 0; i <= in->mask; i++) {
        if (!in->table[i]) continue;
        size_t j = in->hashes[i] & (size - 1);
        while (table[j]) j = (j + 1) & (size - 1);
        table[j] = in->table[i];
        hashes[j] = in->hashes[i];
    }
    free(in->table);
    free(in->hashes);
    in->table = table;
    in->hashes = hashes;
    in->mask = size - 1;
    return 0;
}

/* The id of string s[0:n] in the table, adding it if new; -1 when out of memory. */
static int32_t intern_table(Interner *in, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    size_t j = h & in->mask;
    const size_t *offs = (const size_t *)in->offs.p;
    const size_t *lens = (const size_t *)in->lens.p;
    while (in->table[j]) {
        int32_t id = in->table[j] - 1;
        if (in->hashes[j] == h && lens[id] == n && same_bytes(in->arena.p + offs[id], s, n))
            return id;
        j = (j + 1) & in->mask;
    }
    if (in->count == INT32_MAX - 1) return -1;
    size_t off = in->arena.len;
    if (buf_put(&in->arena, s, n) || buf_put(&in->offs, &off, sizeof off) ||
        buf_put(&in->lens, &n, sizeof n))
        return -1;
    int32_t id = in->count++;
    in->table[j] = id + 1;
    in->hashes[j] = h;
    if ((size_t)in->count * 2 > in->mask && interner_grow(in)) return -1;
    return id;
}

/* A slot of in->recent for s[0:n], from its first and last bytes and its length only. */
static inline size_t quick_hash(const char *s, size_t n) {
    uint64_t a = 0, b = 0;
    if (n >= 8) {
        memcpy(&a, s, 8);
        memcpy(&b, s + n - 8, 8);
    } else if (n >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, s, 4);
        memcpy(&hi, s + n - 4, 4);
        a = lo, b = hi;
    } else if (n) {
        a = (uint64_t)(unsigned char)s[0] | ((uint64_t)(unsigned char)s[n / 2] << 8) |
            ((uint64_t)(unsigned char)s[n - 1] << 16);
    }
    uint64_t h = (a * 0x9E3779B97F4A7C15ULL) ^ (b * 0xC2B2AE3D27D4EB4FULL) ^ (uint64_t)n;
    return (size_t)(h >> (64 - RECENT_BITS));
}

/* The id of string s[0:n], adding it if new; -1 when out of memory. A trace repeats a few
 * thousand strings (names, keys, shapes) hundreds of thousands of times: the last string
 * seen in each of in->recent's slots is checked first, by a hash of a few of its bytes,
 * before the full hash of every byte and the table. A string in no slot, or not the one in
 * its slot, is looked up in the table as before; only the time differs, never the id. */
static int32_t intern(Interner *in, const char *s, size_t n) {
    const size_t *offs = (const size_t *)in->offs.p;
    const size_t *lens = (const size_t *)in->lens.p;
    size_t slot = quick_hash(s, n);
    int32_t seen = in->recent[slot];
    if (seen >= 0 && lens[seen] == n && same_bytes(in->arena.p + offs[seen], s, n)) return seen;
    int32_t id = intern_table(in, s, n);
    if (id >= 0) in->recent[slot] = id;
    return id;
}

/* ------------------------------------------------------------------ the scanner */

typedef struct {
    const char *base, *p, *end;
    Interner strs;
    Buf scratch; /* a decoded string with escapes */
    Buf raw;     /* a nested argument value's compact text */
    /* Where skip_compact skipped the spaces of a nested value (the first MAX_SPACES), and
     * how many it skipped. */
    const char *spaces[MAX_SPACES];
    int n_spaces;
    Buf ph, cat, name, pid, tid, ts, dur, id_val, id_sid;
    Buf arg_ev, arg_key, arg_type, arg_val;
    Buf spare_ev, spare_type, spare_val; /* group_args' output, swapped with the above */
    Buf key_of_sid;  /* int32 per string id: its dense key number, -1 if not an args key */
    Buf key_sids;    /* int32 per dense key number: its string id */
    Buf key_start;   /* int64 per key, and one more: where its arguments start once grouped */
    int32_t arg_keys_seen[MAX_ARGS_PER_EVENT];
    /* The i-th args key of the last event that had one there (string id, dense key number;
     * sid -1 for none): events of a kind list their keys in one order, so a key is mostly
     * the one before at its place, found by one compare instead of the interner. */
    struct {
        int32_t sid, key;
    } key_memo[KEY_MEMO];
    int64_t n;
    int32_t zero_id;
    char why[160]; /* set when the input is not read here */
    int nomem;
    PyThreadState *unlocked; /* the GIL is released while scanning */
    int64_t events_start, events_end; /* the traceEvents list's byte range */
    Buf top;                          /* int64 (key id, start, end) per other top-level member */
} Scan;

static int fail(Scan *s, const char *what) {
    if (!s->why[0])
        snprintf(s->why, sizeof s->why, "traceEvents[%lld] at byte %lld: %s", (long long)s->n,
                 (long long)(s->p - s->base), what);
    return -1;
}

/* JSON's whitespace; every byte it takes is at most ' ', and the bytes a token starts with
 * are above it, so most calls end at the first test. */
#define IS_WS(c) ((c) == ' ' || (c) == '\n' || (c) == '\r' || (c) == '\t')

static inline void skip_ws(Scan *s) {
    const char *p = s->p, *end = s->end;
    if (p < end && *p == ' ' && end - p > 1 && (unsigned char)p[1] > ' ') {
        s->p = p + 1; /* one space, as after Kineto's ':' and ',' */
        return;
    }
#if defined(__SSE2__)
    /* A run such as Kineto's line break and indentation, sixteen bytes at a time. */
    const __m128i sp = _mm_set1_epi8(' '), nl = _mm_set1_epi8('\n');
    const __m128i cr = _mm_set1_epi8('\r'), tab = _mm_set1_epi8('\t');
    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)p);
        __m128i ws = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, sp), _mm_cmpeq_epi8(v, nl)),
                                  _mm_or_si128(_mm_cmpeq_epi8(v, cr), _mm_cmpeq_epi8(v, tab)));
        unsigned other = ~(unsigned)_mm_movemask_epi8(ws) & 0xFFFFu;
        if (other) {
            s->p = p + __builtin_ctz(other);
            return;
        }
        p += 16;
    }
#endif
    while (p < end && (unsigned char)*p <= ' ' && IS_WS(*p)) p++;
    s->p = p;
}

/* skip_ws, for the places where compact text has no whitespace: one test when there is
 * none (the byte there is a token's, above ' '). */
#define SKIP_WS_LIKELY_NONE(s)                                                          \
    do {                                                                                \
        if ((s)->p < (s)->end && (unsigned char)*(s)->p <= ' ') skip_ws(s);             \
    } while (0)

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(Scan *s, const char *q, unsigned *out) {
    if (s->end - q < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(q[i]);
        if (h < 0) return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

static int put_utf8(Buf *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) { /* lone surrogates too, as Python's "surrogatepass" reads them */
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return buf_put(b, u, n);
}

/* The first byte from q on that ends a run of plain string bytes: a quote, a backslash or
 * a control character; `end` where there is none. Sixteen bytes at a time where SSE2 is
 * at hand (every x86-64 CPU), one at a time elsewhere and for the last few. */
static inline const char *plain_end(const char *q, const char *end) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i space = _mm_set1_epi8(0x1F);
    while (end - q >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)q);
        __m128i stop = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
        /* unsigned v <= 0x1F exactly where max(v, 0x1F) == 0x1F */
        stop = _mm_or_si128(stop, _mm_cmpeq_epi8(_mm_max_epu8(v, space), space));
        int mask = _mm_movemask_epi8(stop);
        if (mask) return q + __builtin_ctz((unsigned)mask);
        q += 16;
    }
#endif
    while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
    return q;
}

static int read_escaped(Scan *s, const char *q, const char **out, size_t *n);

/* A JSON string at s->p (the opening quote). Points out and n at its decoded bytes: into
 * the input when it has no escapes, else into s->scratch (read_escaped, out of line). */
static inline int read_string(Scan *s, const char **out, size_t *n) {
    const char *q = plain_end(++s->p, s->end);
    if (q < s->end && *q == '"') {
        *out = s->p;
        *n = (size_t)(q - s->p);
        s->p = q + 1;
        return 0;
    }
    return read_escaped(s, q, out, n);
}

/* The rest of read_string, from q (the first byte that is not plain) on: an escape, a control
 * character or the end of the text. */
static int read_escaped(Scan *s, const char *q, const char **out, size_t *n) {
    if (q >= s->end) return fail(s, "unterminated string");
    if ((unsigned char)*q < 0x20) return fail(s, "control character in a string");
    s->scratch.len = 0;
    if (buf_put(&s->scratch, s->p, (size_t)(q - s->p))) return s->nomem = 1, -1;
    while (1) {
        if (q >= s->end) return fail(s, "unterminated string");
        char c = *q;
        if (c == '"') break;
        if ((unsigned char)c < 0x20) return fail(s, "control character in a string");
        if (c != '\\') {
            const char *r = plain_end(q, s->end);
            if (buf_put(&s->scratch, q, (size_t)(r - q))) return s->nomem = 1, -1;
            q = r;
            continue;
        }
        if (++q >= s->end) return fail(s, "unterminated string");
        char e = *q++;
        char lit;
        switch (e) {
            case '"': lit = '"'; break;
            case '\\': lit = '\\'; break;
            case '/': lit = '/'; break;
            case 'b': lit = '\b'; break;
            case 'f': lit = '\f'; break;
            case 'n': lit = '\n'; break;
            case 'r': lit = '\r'; break;
            case 't': lit = '\t'; break;
            case 'u': {
                unsigned cp;
                if (read_hex4(s, q, &cp)) return fail(s, "bad \\u escape");
                q += 4;
                if (cp >= 0xD800 && cp < 0xDC00 && s->end - q >= 6 && q[0] == '\\' && q[1] == 'u') {
                    unsigned lo;
                    if (!read_hex4(s, q + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        q += 6;
                    }
                }
                if (put_utf8(&s->scratch, cp)) return s->nomem = 1, -1;
                continue;
            }
            default: return fail(s, "bad escape in a string");
        }
        if (buf_put(&s->scratch, &lit, 1)) return s->nomem = 1, -1;
    }
    *out = s->scratch.p;
    *n = s->scratch.len;
    s->p = q + 1;
    return 0;
}

static int intern_string(Scan *s, int32_t *id) {
    const char *str;
    size_t n;
    if (read_string(s, &str, &n)) return -1;
    *id = intern(&s->strs, str, n);
    if (*id < 0) return s->nomem = 1, -1;
    return 0;
}

/* A byte that is an ASCII digit. */
#define IS_DIGIT(c) ((unsigned)((unsigned char)(c) - '0') <= 9)

enum { NUM_INT, NUM_FLOAT, NUM_BIG };

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                               1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                               1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The common numbers, read inline: an optional '-', an integer part without leading zeros,
 * an optional fraction, no exponent, at most 19 digits taken into the mantissa in all (so
 * it cannot overflow) and a byte after it within the text. Returns the end of the number,
 * with *mant its digits and *frac the number of fraction digits (-1: an integer), or NULL
 * for any other text: read_number then reads it, or names the problem. The values callers
 * make of these are the ones read_number makes of the same text. */
static inline const char *simple_number(const char *q, const char *end, uint64_t *mant,
                                        int *frac, int *neg) {
    *neg = q < end && *q == '-';
    q += *neg;
    if (q >= end || !IS_DIGIT(*q)) return NULL;
    uint64_t m = 0;
    int room = 19; /* digits the mantissa can still take */
    if (*q == '0') {
        q++;
    } else {
        const char *from = q, *lim = end - q > room ? q + room : end;
        while (q < lim && IS_DIGIT(*q)) m = m * 10 + (uint64_t)(*q++ - '0');
        room -= (int)(q - from);
    }
    if (q >= end) return NULL;
    int f = -1;
    if (*q == '.') {
        const char *from = ++q, *lim = end - q > room ? q + room : end;
        while (q < lim && IS_DIGIT(*q)) m = m * 10 + (uint64_t)(*q++ - '0');
        f = (int)(q - from);
        if (f == 0 || q >= end) return NULL;
    }
    /* a digit here: more than the mantissa takes (or a leading zero's next digit) */
    if (IS_DIGIT(*q) || *q == 'e' || *q == 'E') return NULL;
    *mant = m;
    *frac = f;
    return q;
}

/* A JSON number at s->p. NUM_INT: *iv holds it; NUM_FLOAT: *dv; NUM_BIG: an integer beyond
 * int64 (dv holds it as a double). text and tlen: its text. Where numbers are common (ts,
 * dur, pid, tid, arguments) number_at reads the usual ones first. */
static int read_number(Scan *s, int *kind, int64_t *iv, double *dv, const char **text,
                       size_t *tlen) {
    const char *q = s->p, *start = s->p, *end = s->end;
    int neg = 0;
    if (q < end && *q == '-') neg = 1, q++;
    if (q >= end || !IS_DIGIT(*q)) return fail(s, "bad number");
    uint64_t mant = 0;
    int overflow = 0;
    if (*q == '0') {
        q++;
    } else {
        while (q < end && IS_DIGIT(*q)) {
            if (mant > (UINT64_MAX - 9) / 10) overflow = 1;
            else mant = mant * 10 + (uint64_t)(*q - '0');
            q++;
        }
    }
    int frac_digits = 0, is_float = 0, exp_val = 0;
    if (q < s->end && *q == '.') {
        is_float = 1;
        q++;
        if (q >= end || !IS_DIGIT(*q)) return fail(s, "bad number");
        while (q < end && IS_DIGIT(*q)) {
            if (mant > (UINT64_MAX - 9) / 10) overflow = 1;
            else mant = mant * 10 + (uint64_t)(*q - '0'), frac_digits++;
            q++;
        }
    }
    if (q < s->end && (*q == 'e' || *q == 'E')) {
        is_float = 1;
        q++;
        int eneg = 0;
        if (q < s->end && (*q == '+' || *q == '-')) eneg = *q == '-', q++;
        if (q >= s->end || *q < '0' || *q > '9') return fail(s, "bad number");
        while (q < s->end && *q >= '0' && *q <= '9') {
            if (exp_val < 100000) exp_val = exp_val * 10 + (*q - '0');
            q++;
        }
        if (eneg) exp_val = -exp_val;
    }
    size_t n = (size_t)(q - start);
    if (n > MAX_NUMBER_CHARS) return fail(s, "number too long");
    s->p = q;
    *text = start;
    *tlen = n;
    if (!is_float && !overflow && (neg ? mant <= (uint64_t)INT64_MAX + 1 : mant <= (uint64_t)INT64_MAX)) {
        *kind = NUM_INT;
        *iv = neg ? (int64_t)(0 - mant) : (int64_t)mant;
        return 0;
    }
    /* Exact fast path: the mantissa and the power of ten are both exact doubles, so one
     * correctly rounded multiply or divide gives the correctly rounded value. */
    int e10 = exp_val - frac_digits;
    if (!overflow && mant <= (1ULL << 53) && e10 >= -22 && e10 <= 22) {
        double d = (double)mant;
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        *dv = neg ? -d : d;
    } else {
        char tmp[MAX_NUMBER_CHARS + 1];
        memcpy(tmp, start, n);
        tmp[n] = 0;
        /* Correctly rounded and locale-independent, but it needs the GIL. Rare: long
         * mantissas (absolute epoch-us timestamps with decimals) and large exponents. */
        PyEval_RestoreThread(s->unlocked);
        *dv = PyOS_string_to_double(tmp, NULL, NULL);
        int bad = *dv == -1.0 && PyErr_Occurred();
        if (bad) PyErr_Clear();
        s->unlocked = PyEval_SaveThread();
        if (bad) return fail(s, "bad number");
    }
    /* msgspec refuses a float beyond the double range ("Number out of range"): so does
     * this scanner, leaving the message to the pure-Python path. */
    if (is_float && isinf(*dv)) return fail(s, "number out of range");
    *kind = is_float ? NUM_FLOAT : NUM_BIG;
    return 0;
}

/* read_number's result for the number at s->p, the common ones (simple_number's) read
 * inline: an integer within int64, or a decimal whose digits and scale are exact doubles
 * (frac <= 19), one correctly rounded divide as read_number makes. */
static ALWAYS_INLINE int number_at(Scan *s, int *kind, int64_t *iv, double *dv,
                                   const char **text, size_t *tlen) {
    uint64_t m;
    int frac, neg;
    const char *q = simple_number(s->p, s->end, &m, &frac, &neg);
    if (q && (frac < 0 ? m <= (uint64_t)INT64_MAX : m <= (1ULL << 53))) {
        if (frac < 0) {
            *iv = neg ? -(int64_t)m : (int64_t)m;
            *kind = NUM_INT;
        } else {
            double d = (double)m / POW10[frac];
            *dv = neg ? -d : d;
            *kind = NUM_FLOAT;
        }
        *text = s->p;
        *tlen = (size_t)(q - s->p);
        s->p = q;
        return 0;
    }
    return read_number(s, kind, iv, dv, text, tlen);
}


static int expect_literal(Scan *s, const char *lit, size_t n) {
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, lit, n) != 0) return fail(s, "bad literal");
    s->p += n;
    return 0;
}

/* Skip one JSON value, checking it. */
static int skip_value(Scan *s, int depth) {
    if (depth > MAX_DEPTH) return fail(s, "nesting too deep");
    skip_ws(s);
    if (s->p >= s->end) return fail(s, "unexpected end of data");
    char c = *s->p;
    if (c == '"') {
        const char *str;
        size_t n;
        return read_string(s, &str, &n);
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        s->p++;
        skip_ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return 0;
        }
        while (1) {
            if (c == '{') {
                skip_ws(s);
                if (s->p >= s->end || *s->p != '"') return fail(s, "expected an object key");
                if (skip_value(s, depth + 1)) return -1;
                skip_ws(s);
                if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
                s->p++;
            }
            if (skip_value(s, depth + 1)) return -1;
            skip_ws(s);
            if (s->p >= s->end) return fail(s, "unexpected end of data");
            if (*s->p == ',') {
                s->p++;
                continue;
            }
            if (*s->p == close) {
                s->p++;
                return 0;
            }
            return fail(s, "expected ',' or a closing bracket");
        }
    }
    if (c == 't') return expect_literal(s, "true", 4);
    if (c == 'f') return expect_literal(s, "false", 5);
    if (c == 'n') return expect_literal(s, "null", 4);
    int kind;
    int64_t iv;
    double dv;
    const char *text;
    size_t tlen;
    return read_number(s, &kind, &iv, &dv, &text, &tlen);
}

/* A nested argument value (s->p at its '[' or '{') checked in one loop, without a call per
 * element: valid JSON with no escapes and no exponents, up to 63 levels deep, and no
 * whitespace but one space after a ',' or a ':' (as Kineto and Python's json write lists:
 * `[[8, 128], [128]]`). Then s->p is after it, and it returns 1 when it has no whitespace
 * (its text as written is its compact text), 2 when it has such spaces (its compact text is
 * the text without the spaces outside its strings: put_unspaced). 0 for anything else,
 * valid or not, which copy_compact then reads from the start and decides. So this never
 * refuses what copy_compact takes, and takes only what it takes, with the same compact
 * text. */
static int skip_compact(Scan *s) {
    const char *p = s->p, *end = s->end;
    uint64_t objects = 0; /* bit 0: the innermost open container is an object, and so on */
    int depth = 0;
    s->n_spaces = 0;
    for (;;) { /* at a value */
        if (p >= end) return 0;
        char c = *p;
        if (c == '[' || c == '{') {
            if (++p >= end) return 0;
            if (*p == (c == '[' ? ']' : '}')) { /* empty */
                p++;
                goto after;
            }
            if (depth == 63) return 0;
            depth++;
            objects = (objects << 1) | (c == '{');
            if (c == '[') continue;
            goto key;
        }
        if (c == '"') {
            const char *q = plain_end(p + 1, end);
            if (q >= end || *q != '"') return 0;
            p = q + 1;
        } else if (c == 't' || c == 'f' || c == 'n') {
            const char *lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
            size_t n = c == 'f' ? 5 : 4;
            if ((size_t)(end - p) < n || memcmp(p, lit, n) != 0) return 0;
            p += n;
        } else {
            const char *q = p;
            if (*q == '-') q++;
            if (q >= end || !IS_DIGIT(*q)) return 0;
            if (*q == '0') q++;
            else
                while (q < end && IS_DIGIT(*q)) q++;
            if (q < end && *q == '.') {
                if (++q >= end || !IS_DIGIT(*q)) return 0;
                while (q < end && IS_DIGIT(*q)) q++;
            }
            if (q - p > MAX_NUMBER_CHARS) return 0; /* an exponent: the next test fails */
            p = q;
        }
    after: /* after a value */
        if (depth == 0) {
            s->p = p;
            return s->n_spaces ? 2 : 1;
        }
        if (p >= end) return 0;
        if (*p == ',') {
            p++;
            if (p < end && *p == ' ') {
                if (s->n_spaces < MAX_SPACES) s->spaces[s->n_spaces] = p;
                s->n_spaces++, p++;
            }
            if (!(objects & 1)) continue;
        } else if (*p == ((objects & 1) ? '}' : ']')) {
            p++;
            depth--;
            objects >>= 1;
            goto after;
        } else {
            return 0;
        }
    key: /* at an object's key */
        if (p >= end || *p != '"') return 0;
        {
            const char *q = plain_end(p + 1, end);
            if (q >= end || *q != '"') return 0;
            p = q + 1;
        }
        if (p >= end || *p != ':') return 0;
        p++;
        if (p < end && *p == ' ') {
            if (s->n_spaces < MAX_SPACES) s->spaces[s->n_spaces] = p;
            s->n_spaces++, p++;
        }
    }
}

/* The compact text of a value skip_compact took with spaces (its result 2), put in `raw`:
 * the text from p to end without the spaces it skipped (s->spaces, where they all fit),
 * else without every space outside its strings (which have no escapes, so each quote
 * opens or closes one): the same bytes. */
static int put_unspaced(Scan *s, Buf *raw, const char *p, const char *end) {
    if (buf_reserve(raw, (size_t)(end - p))) return -1;
    char *o = raw->p + raw->len;
    if (s->n_spaces <= MAX_SPACES) {
        for (int i = 0; i < s->n_spaces; i++) {
            size_t n = (size_t)(s->spaces[i] - p);
            memcpy(o, p, n);
            o += n;
            p = s->spaces[i] + 1;
        }
        memcpy(o, p, (size_t)(end - p));
        o += end - p;
    } else {
        int in_string = 0;
        for (; p < end; p++) {
            char c = *p;
            if (c == '"') in_string ^= 1;
            else if (c == ' ' && !in_string) continue;
            *o++ = c;
        }
    }
    raw->len = (size_t)(o - raw->p);
    return 0;
}

/* Check one JSON value and append its text to `raw` without insignificant whitespace: for a
 * nested argument value that skip_compact leaves (whitespace, escapes, exponents, deep
 * nesting, or an error to name). */
static int copy_compact(Scan *s, int depth, Buf *raw) {
    if (depth > MAX_DEPTH) return fail(s, "nesting too deep");
    skip_ws(s);
    if (s->p >= s->end) return fail(s, "unexpected end of data");
    char c = *s->p;
    if (c == '"') {
        const char *start = s->p;
        const char *str;
        size_t n;
        /* The text is kept as written (escapes and all); it is decoded again later. */
        if (read_string(s, &str, &n)) return -1;
        if (buf_put(raw, start, (size_t)(s->p - start))) return s->nomem = 1, -1;
        return 0;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        s->p++;
        if (buf_put(raw, &c, 1)) return s->nomem = 1, -1;
        skip_ws(s);
        if (s->p < s->end && *s->p == close) {
            s->p++;
            if (buf_put(raw, &close, 1)) return s->nomem = 1, -1;
            return 0;
        }
        while (1) {
            if (c == '{') {
                skip_ws(s);
                if (s->p >= s->end || *s->p != '"') return fail(s, "expected an object key");
                if (copy_compact(s, depth + 1, raw)) return -1;
                skip_ws(s);
                if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
                s->p++;
                if (buf_put(raw, ":", 1)) return s->nomem = 1, -1;
            }
            if (copy_compact(s, depth + 1, raw)) return -1;
            skip_ws(s);
            if (s->p >= s->end) return fail(s, "unexpected end of data");
            if (*s->p == ',') {
                s->p++;
                if (buf_put(raw, ",", 1)) return s->nomem = 1, -1;
                continue;
            }
            if (*s->p == close) {
                s->p++;
                if (buf_put(raw, &close, 1)) return s->nomem = 1, -1;
                return 0;
            }
            return fail(s, "expected ',' or a closing bracket");
        }
    }
    if (c == 't' || c == 'f' || c == 'n') {
        const char *lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t n = strlen(lit);
        if (expect_literal(s, lit, n)) return -1;
        if (buf_put(raw, lit, n)) return s->nomem = 1, -1;
        return 0;
    }
    int kind;
    int64_t iv;
    double dv;
    const char *text;
    size_t tlen;
    if (read_number(s, &kind, &iv, &dv, &text, &tlen)) return -1;
    if (buf_put(raw, text, tlen)) return s->nomem = 1, -1;
    return 0;
}

/* After a member or an element: 1 when a ',' follows (another one comes), 0 at `close`
 * (consumed), -1 on anything else. */
static inline int after_item(Scan *s, char close, const char *what) {
    SKIP_WS_LIKELY_NONE(s);
    if (s->p >= s->end) return fail(s, "unexpected end of data");
    if (*s->p == ',') {
        s->p++;
        return 1;
    }
    if (*s->p == close) {
        s->p++;
        return 0;
    }
    return fail(s, what);
}

/* The dense number of an args key (by its string id), numbering keys as they first appear. */
static int32_t dense_key(Scan *s, int32_t sid) {
    size_t have = s->key_of_sid.len / sizeof(int32_t);
    if ((size_t)sid >= have) {
        size_t want = (size_t)sid + 1024;
        if (buf_reserve(&s->key_of_sid, (want - have) * sizeof(int32_t))) return -1;
        memset(s->key_of_sid.p + s->key_of_sid.len, 0xFF, (want - have) * sizeof(int32_t));
        s->key_of_sid.len = want * sizeof(int32_t);
    }
    int32_t *map = (int32_t *)s->key_of_sid.p;
    if (map[sid] < 0) {
        map[sid] = (int32_t)(s->key_sids.len / sizeof(int32_t));
        if (buf_put(&s->key_sids, &sid, sizeof sid)) return -1;
    }
    return map[sid];
}

/* One argument of the event being read, under dense key number `key`. */
static int add_arg(Scan *s, int32_t key, uint8_t type, int64_t val) {
    int32_t ev = (int32_t)s->n;
    if (buf_put(&s->arg_ev, &ev, 4) || buf_put(&s->arg_key, &key, 4) ||
        buf_put(&s->arg_type, &type, 1) || buf_put(&s->arg_val, &val, 8))
        return s->nomem = 1, -1;
    return 0;
}

/* The args key at s->p: its string id and dense key number. */
static int read_arg_key(Scan *s, int place, int32_t *sid, int32_t *key) {
    const char *k;
    size_t kn;
    if (read_string(s, &k, &kn)) return -1;
    if (place < KEY_MEMO && s->key_memo[place].sid >= 0) {
        const Interner *in = &s->strs;
        int32_t m = s->key_memo[place].sid;
        if (((const size_t *)in->lens.p)[m] == kn &&
            same_bytes(in->arena.p + ((const size_t *)in->offs.p)[m], k, kn)) {
            *sid = m;
            *key = s->key_memo[place].key;
            return 0;
        }
    }
    *sid = intern(&s->strs, k, kn);
    if (*sid < 0) return s->nomem = 1, -1;
    *key = dense_key(s, *sid);
    if (*key < 0) return s->nomem = 1, -1;
    if (place < KEY_MEMO) s->key_memo[place].sid = *sid, s->key_memo[place].key = *key;
    return 0;
}

static int read_args(Scan *s) {
    s->p++; /* '{' */
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    int nkeys = 0;
    while (1) {
        SKIP_WS_LIKELY_NONE(s);
        if (s->p >= s->end || *s->p != '"') return fail(s, "expected an args key");
        int32_t sid, key;
        if (read_arg_key(s, nkeys, &sid, &key)) return -1;
        for (int i = 0; i < nkeys; i++)
            if (s->arg_keys_seen[i] == sid) return fail(s, "repeated key in args");
        if (nkeys == MAX_ARGS_PER_EVENT) return fail(s, "too many args");
        s->arg_keys_seen[nkeys++] = sid;
        SKIP_WS_LIKELY_NONE(s);
        if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
        s->p++;
        SKIP_WS_LIKELY_NONE(s);
        if (s->p >= s->end) return fail(s, "unexpected end of data");
        char c = *s->p;
        if (c == '"') {
            int32_t id;
            if (intern_string(s, &id) || add_arg(s, key, T_STR, id)) return -1;
        } else if (c == '{' || c == '[') {
            /* Kept as its compact text: the text as written, where skip_compact takes it
             * without whitespace. */
            const char *text = s->p;
            size_t len;
            int taken = skip_compact(s);
            if (taken == 1) {
                len = (size_t)(s->p - text);
            } else if (taken == 2) {
                s->raw.len = 0;
                if (put_unspaced(s, &s->raw, text, s->p)) return s->nomem = 1, -1;
                text = s->raw.p, len = s->raw.len;
            } else {
                s->raw.len = 0;
                if (copy_compact(s, 1, &s->raw)) return -1;
                text = s->raw.p, len = s->raw.len;
            }
            int32_t id = intern(&s->strs, text, len);
            if (id < 0) return s->nomem = 1, -1;
            if (add_arg(s, key, T_RAW, id)) return -1;
        } else if (c == 't') {
            if (expect_literal(s, "true", 4) || add_arg(s, key, T_TRUE, 1)) return -1;
        } else if (c == 'f') {
            if (expect_literal(s, "false", 5) || add_arg(s, key, T_FALSE, 0)) return -1;
        } else if (c == 'n') {
            if (expect_literal(s, "null", 4) || add_arg(s, key, T_NULL, 0)) return -1;
        } else {
            int kind;
            int64_t iv;
            double dv;
            const char *text;
            size_t tlen;
            if (number_at(s, &kind, &iv, &dv, &text, &tlen)) return -1;
            if (kind == NUM_INT) {
                if (add_arg(s, key, T_INT, iv)) return -1;
            } else if (kind == NUM_FLOAT) {
                int64_t bits;
                memcpy(&bits, &dv, 8);
                if (add_arg(s, key, T_FLOAT, bits)) return -1;
            } else {
                int32_t id = intern(&s->strs, text, tlen);
                if (id < 0) return s->nomem = 1, -1;
                if (add_arg(s, key, T_BIGINT, id)) return -1;
            }
        }
        int more = after_item(s, '}', "expected ',' or '}' in args");
        if (more <= 0) return more;
    }
}

/* The event fields read here, by their key. */
enum { F_OTHER, F_PH, F_CAT, F_NAME, F_PID, F_TID, F_TS, F_DUR, F_ID, F_ARGS, F_S, F_BP };

static inline int field_of(const char *k, size_t n) {
#define KEY_IS(name) (memcmp(k, name, sizeof name - 1) == 0)
    switch (n) {
        case 1: return k[0] == 's' ? F_S : F_OTHER;
        case 2:
            if (KEY_IS("ph")) return F_PH;
            if (KEY_IS("ts")) return F_TS;
            if (KEY_IS("id")) return F_ID;
            if (KEY_IS("bp")) return F_BP;
            return F_OTHER;
        case 3:
            if (KEY_IS("cat")) return F_CAT;
            if (KEY_IS("pid")) return F_PID;
            if (KEY_IS("tid")) return F_TID;
            if (KEY_IS("dur")) return F_DUR;
            return F_OTHER;
        case 4:
            if (KEY_IS("name")) return F_NAME;
            if (KEY_IS("args")) return F_ARGS;
            return F_OTHER;
        default: return F_OTHER;
    }
#undef KEY_IS
}

/* pid/tid: an integer (kept as its decimal text) or a string. */
static int read_track_part(Scan *s, int32_t *id) {
    if (*s->p == '"') return intern_string(s, id);
    int kind;
    int64_t iv;
    double dv;
    const char *text;
    size_t tlen;
    if (number_at(s, &kind, &iv, &dv, &text, &tlen)) return -1;
    if (kind != NUM_INT) return fail(s, "pid/tid is not an integer");
    /* "-0" is the integer 0, whose text is "0". */
    if (iv == 0) {
        *id = s->zero_id;
        return 0;
    }
    *id = intern(&s->strs, text, tlen);
    if (*id < 0) return s->nomem = 1, -1;
    return 0;
}

static int read_time(Scan *s, double *out) {
    if (*s->p == 'n') {
        *out = NAN;
        return expect_literal(s, "null", 4);
    }
    if (*s->p != '-' && (*s->p < '0' || *s->p > '9')) return fail(s, "ts/dur is not a number");
    int kind;
    int64_t iv;
    double dv;
    const char *text;
    size_t tlen;
    if (number_at(s, &kind, &iv, &dv, &text, &tlen)) return -1;
    *out = kind == NUM_INT ? (double)iv : dv;
    return 0;
}

static int read_event(Scan *s) {
    int32_t ph = 0, cat = 0, name = 0, pid = s->zero_id, tid = s->zero_id, id_sid = -1;
    double ts = NAN, dur = NAN;
    int64_t id_val = 0;
    s->p++; /* '{' */
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
    } else {
        while (1) {
            SKIP_WS_LIKELY_NONE(s);
            if (s->p >= s->end || *s->p != '"') return fail(s, "expected a key");
            const char *k;
            size_t kn;
            if (read_string(s, &k, &kn)) return -1;
            /* Known before the value is read: reading it may reuse scratch, where a key
             * with escapes was decoded. */
            int field = field_of(k, kn);
            SKIP_WS_LIKELY_NONE(s);
            if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
            s->p++;
            SKIP_WS_LIKELY_NONE(s);
            if (s->p >= s->end) return fail(s, "unexpected end of data");
            char c = *s->p;
            switch (field) {
                case F_PH:
                case F_CAT:
                case F_NAME:
                    if (c != '"') return fail(s, "ph/cat/name is not a string");
                    if (intern_string(s, field == F_PH ? &ph : field == F_CAT ? &cat : &name))
                        return -1;
                    break;
                case F_PID:
                    if (read_track_part(s, &pid)) return -1;
                    break;
                case F_TID:
                    if (read_track_part(s, &tid)) return -1;
                    break;
                case F_TS:
                    if (read_time(s, &ts)) return -1;
                    break;
                case F_DUR:
                    if (read_time(s, &dur)) return -1;
                    break;
                case F_ID:
                    if (c == '"') {
                        if (intern_string(s, &id_sid)) return -1;
                        id_val = 0;
                    } else if (c == 'n') {
                        if (expect_literal(s, "null", 4)) return -1;
                        id_val = 0, id_sid = -1;
                    } else {
                        int kind;
                        double dv;
                        const char *text;
                        size_t tlen;
                        if (read_number(s, &kind, &id_val, &dv, &text, &tlen)) return -1;
                        if (kind != NUM_INT) return fail(s, "id is not an integer");
                        id_sid = -1;
                    }
                    break;
                case F_ARGS:
                    if (c == 'n') {
                        if (expect_literal(s, "null", 4)) return -1;
                    } else if (c == '{') {
                        if (read_args(s)) return -1;
                    } else {
                        return fail(s, "args is not an object");
                    }
                    break;
                case F_S:
                case F_BP:
                    if (c != '"') return fail(s, "s/bp is not a string");
                    if (skip_value(s, 1)) return -1;
                    break;
                default:
                    if (skip_value(s, 1)) return -1;
            }
            int more = after_item(s, '}', "expected ',' or '}'");
            if (more < 0) return -1;
            if (!more) break;
        }
    }
    PUT(s->ph, int32_t, ph);
    PUT(s->cat, int32_t, cat);
    PUT(s->name, int32_t, name);
    PUT(s->pid, int32_t, pid);
    PUT(s->tid, int32_t, tid);
    PUT(s->ts, double, ts);
    PUT(s->dur, double, dur);
    PUT(s->id_val, int64_t, id_val);
    PUT(s->id_sid, int32_t, id_sid);
    return 0;
nomem:
    s->nomem = 1;
    return -1;
}

static int scan_array(Scan *s) {
    skip_ws(s);
    if (s->p >= s->end || *s->p != '[') return fail(s, "traceEvents is not a list");
    s->events_start = (int64_t)(s->p - s->base);
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
    } else {
        while (1) {
            skip_ws(s);
            if (s->p >= s->end || *s->p != '{') return fail(s, "event is not an object");
            if (read_event(s)) return -1;
            if (s->n == INT32_MAX - 1) return fail(s, "too many events");
            s->n++;
            int more = after_item(s, ']', "expected ',' or ']' between events");
            if (more < 0) return -1;
            if (!more) break;
        }
    }
    s->events_end = (int64_t)(s->p - s->base);
    return 0;
}

/* A whole trace: a list of events, or an object whose "traceEvents" member is that list.
 * Every other member is skipped (checked as JSON) and its byte range kept in s->top as
 * (key string id, start, end), for the caller to decode. */
static int scan_trace(Scan *s) {
    skip_ws(s);
    if (s->p < s->end && *s->p == '[') {
        if (scan_array(s)) return -1;
    } else {
        if (s->p >= s->end || *s->p != '{') return fail(s, "the trace is not a JSON object");
        s->p++;
        skip_ws(s);
        int seen = 0;
        if (s->p < s->end && *s->p == '}') return fail(s, "no traceEvents");
        while (1) {
            skip_ws(s);
            if (s->p >= s->end || *s->p != '"') return fail(s, "expected a key");
            int32_t key;
            if (intern_string(s, &key)) return -1;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
            s->p++;
            skip_ws(s);
            const char *key_text = s->strs.arena.p + ((const size_t *)s->strs.offs.p)[key];
            size_t key_len = ((const size_t *)s->strs.lens.p)[key];
            if (key_len == 11 && memcmp(key_text, "traceEvents", 11) == 0) {
                if (seen++) return fail(s, "traceEvents twice");
                if (scan_array(s)) return -1;
            } else {
                int64_t start = (int64_t)(s->p - s->base);
                if (skip_value(s, 1)) return -1;
                int64_t entry[3] = {key, start, (int64_t)(s->p - s->base)};
                if (buf_put(&s->top, entry, sizeof entry)) return s->nomem = 1, -1;
            }
            int more = after_item(s, '}', "expected ',' or '}' at the top level");
            if (more < 0) return -1;
            if (!more) break;
        }
        if (!seen) return fail(s, "no traceEvents");
    }
    skip_ws(s);
    if (s->p != s->end) return fail(s, "data after the trace");
    return 0;
}

/* The arguments grouped by key (a counting sort, stable: event order within a key) into
 * `ev`, `type` and `val` (room for every argument each), and each key's first index into
 * `start` (room for the keys and one more); the ungrouped keys are emptied. */
static int group_args_into(Scan *s, int32_t *ev1, uint8_t *type1, int64_t *val1,
                           int64_t *start) {
    size_t nkeys = s->key_sids.len / sizeof(int32_t);
    size_t n = s->arg_type.len;
    memset(start, 0, (nkeys + 1) * sizeof(int64_t));
    const int32_t *key = (const int32_t *)s->arg_key.p;
    for (size_t i = 0; i < n; i++) start[key[i] + 1]++;
    for (size_t k = 0; k < nkeys; k++) start[k + 1] += start[k];
    int64_t *next = malloc((nkeys + 1) * sizeof(int64_t));
    if (!next) return -1;
    memcpy(next, start, (nkeys + 1) * sizeof(int64_t));
    const int32_t *ev0 = (const int32_t *)s->arg_ev.p;
    const uint8_t *type0 = (const uint8_t *)s->arg_type.p;
    const int64_t *val0 = (const int64_t *)s->arg_val.p;
    for (size_t i = 0; i < n; i++) {
        int64_t j = next[key[i]]++;
        ev1[j] = ev0[i];
        type1[j] = type0[i];
        val1[j] = val0[i];
    }
    free(next);
    s->arg_key.len = 0;
    return 0;
}

/* The arguments grouped by key in place (`key_start` then holds each key's first index):
 * grouped into the spare buffers, kept from the last grouping (no growth once they fit a
 * batch), then swapped in, the ungrouped ones becoming the spares. */
static int group_args(Scan *s) {
    size_t nkeys = s->key_sids.len / sizeof(int32_t);
    size_t n = s->arg_type.len;
    Buf *ev = &s->spare_ev, *type = &s->spare_type, *val = &s->spare_val;
    ev->len = type->len = val->len = s->key_start.len = 0;
    if (buf_reserve(&s->key_start, (nkeys + 1) * sizeof(int64_t)) ||
        buf_reserve(ev, n * 4 + 1) || buf_reserve(type, n + 1) || buf_reserve(val, n * 8 + 1) ||
        group_args_into(s, (int32_t *)ev->p, (uint8_t *)type->p, (int64_t *)val->p,
                        (int64_t *)s->key_start.p))
        return -1;
    s->key_start.len = (nkeys + 1) * sizeof(int64_t);
    ev->len = n * 4, type->len = n, val->len = n * 8;
    Buf t;
    t = s->arg_ev, s->arg_ev = *ev, *ev = t, ev->len = 0;
    t = s->arg_type, s->arg_type = *type, *type = t, type->len = 0;
    t = s->arg_val, s->arg_val = *val, *val = t, val->len = 0;
    return 0;
}

/* ------------------------------------------------------------------ streaming */

/* The trace read in chunks: `scan_feed` reads every complete unit (a top-level member, or
 * one event and the separator after it) of the text it has and keeps the rest for the next
 * chunk. A unit is parsed only once the text holds all of it (`value_end` finds its end
 * first), so a chunk boundary never cuts one: the columns, the string ids and their order
 * are those of a whole-text scan. */
enum { ST_START, ST_TOP_FIRST, ST_TOP_KEY, ST_TOP_AFTER, ST_EV_FIRST, ST_EV, ST_EV_AFTER, ST_END };

/* After the JSON value starting at p (no leading space), or NULL when the text ends first.
 * Malformed values get some end: the parser that follows names the problem. */
static const char *value_end(const char *p, const char *end) {
    if (p >= end) return NULL;
    char c = *p;
    if (c == '"' || c == '{' || c == '[') {
        int depth = 0;
        int in_str = 0;
        for (; p < end; p++) {
            char d = *p;
            if (in_str) {
                const char *q = memchr(p, '"', (size_t)(end - p));
                const char *bs = memchr(p, '\\', q ? (size_t)(q - p) : (size_t)(end - p));
                if (bs) {
                    p = bs + 1; /* skip the escaped character */
                    continue;
                }
                if (!q) return NULL;
                p = q;
                in_str = 0;
                if (depth == 0) return p + 1;
                continue;
            }
            if (d == '"') in_str = 1;
            else if (d == '{' || d == '[') depth++;
            else if (d == '}' || d == ']') {
                if (--depth <= 0) return p + 1;
            }
        }
        return NULL;
    }
    while (p < end && ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || *p == '-' ||
                       *p == '+' || *p == '.' || (*p >= 'A' && *p <= 'Z')))
        p++;
    return p < end ? p : NULL;
}

typedef struct {
    Scan s;
    Buf pending;  /* text not yet read: the cut unit at the end of the last chunk */
    Buf top_text; /* the other top-level members' values, back to back */
    int64_t offset; /* bytes of the trace before pending */
    int state, bare;
    size_t window; /* events starting this close to the end of the text are checked whole */
} Stream;

/* Where the columns stood before an event: an event cut by the end of a chunk is undone. */
typedef struct {
    size_t arg_ev, arg_key, arg_type, arg_val, key_sids, arena;
    int32_t strings;
} Mark;

static void stream_mark(Scan *s, Mark *m) {
    m->arg_ev = s->arg_ev.len, m->arg_key = s->arg_key.len, m->arg_type = s->arg_type.len;
    m->arg_val = s->arg_val.len, m->key_sids = s->key_sids.len;
    m->arena = s->strs.arena.len, m->strings = s->strs.count;
}

/* Undo what a cut event added: its arguments, its new args keys and its new strings (the
 * string table is rebuilt: rare, only for an event longer than the window). */
static void stream_undo(Scan *s, const Mark *m) {
    s->arg_ev.len = m->arg_ev, s->arg_key.len = m->arg_key, s->arg_type.len = m->arg_type;
    s->arg_val.len = m->arg_val;
    int32_t *map = (int32_t *)s->key_of_sid.p;
    const int32_t *sids = (const int32_t *)s->key_sids.p;
    for (size_t k = m->key_sids / sizeof(int32_t); k < s->key_sids.len / sizeof(int32_t); k++)
        map[sids[k]] = -1;
    s->key_sids.len = m->key_sids;
    memset(s->key_memo, 0xFF, sizeof s->key_memo); /* they may name keys or strings undone */
    Interner *in = &s->strs;
    if (in->count == m->strings) return;
    in->count = m->strings;
    memset(in->recent, 0xFF, sizeof in->recent); /* they may name the strings dropped */
    in->arena.len = m->arena;
    in->offs.len = in->lens.len = (size_t)m->strings * sizeof(size_t);
    memset(in->table, 0, (in->mask + 1) * sizeof(int32_t));
    const size_t *offs = (const size_t *)in->offs.p;
    const size_t *lens = (const size_t *)in->lens.p;
    for (int32_t id = 0; id < in->count; id++) {
        uint64_t h = hash_bytes(in->arena.p + offs[id], lens[id]);
        size_t j = h & in->mask;
        while (in->table[j]) j = (j + 1) & in->mask;
        in->table[j] = id + 1;
        in->hashes[j] = h;
    }
}

/* Reads what it can of text[0:len], the trace's text from st->offset on; *used: the bytes
 * read (the rest is a cut unit, for the caller to keep). 0, or -1 on an error (s->why or
 * s->nomem says which). With `final`, the text is all there: a unit that does not end is
 * an error. */
static int stream_run(Stream *st, const char *text, size_t len, int final, size_t *used) {
    Scan *s = &st->s;
    s->base = s->p = text ? text : "";
    s->end = s->base + len;
    while (1) {
        skip_ws(s);
        if (st->state == ST_END) {
            if (s->p < s->end) return fail(s, "data after the trace");
            break;
        }
        if (s->p >= s->end) {
            if (final) return fail(s, "unexpected end of data");
            break;
        }
        char c = *s->p;
        if (st->state == ST_START) {
            if (c == '[') {
                st->bare = 1;
                s->events_start = st->offset + (s->p - s->base);
                s->p++;
                st->state = ST_EV_FIRST;
            } else if (c == '{') {
                s->p++;
                st->state = ST_TOP_FIRST;
            } else {
                return fail(s, "the trace is not a JSON object");
            }
        } else if (st->state == ST_TOP_FIRST || st->state == ST_TOP_KEY) {
            if (st->state == ST_TOP_FIRST && c == '}') return fail(s, "no traceEvents");
            if (c != '"') return fail(s, "expected a key");
            const char *q = value_end(s->p, s->end);
            if (q) {
                int events = q - s->p == 13 && memcmp(s->p + 1, "traceEvents", 11) == 0;
                while (q < s->end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t')) q++;
                if (q >= s->end) q = NULL;
                else if (*q == ':') {
                    q++;
                    while (q < s->end && (*q == ' ' || *q == '\n' || *q == '\r' || *q == '\t'))
                        q++;
                    if (q >= s->end) q = NULL;
                    else if (!events) q = value_end(q, s->end);
                }
            }
            if (!q && !final) break; /* the member is cut: wait for the rest */
            int32_t key;
            if (intern_string(s, &key)) return -1;
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') return fail(s, "expected ':'");
            s->p++;
            skip_ws(s);
            const char *key_text = s->strs.arena.p + ((const size_t *)s->strs.offs.p)[key];
            size_t key_len = ((const size_t *)s->strs.lens.p)[key];
            if (key_len == 11 && memcmp(key_text, "traceEvents", 11) == 0) {
                if (s->events_start >= 0) return fail(s, "traceEvents twice");
                if (s->p >= s->end || *s->p != '[') return fail(s, "traceEvents is not a list");
                s->events_start = st->offset + (s->p - s->base);
                s->p++;
                st->state = ST_EV_FIRST;
            } else {
                const char *start = s->p;
                if (skip_value(s, 1)) return -1;
                int64_t entry[3] = {key, (int64_t)st->top_text.len, 0};
                if (buf_put(&st->top_text, start, (size_t)(s->p - start))) return s->nomem = 1, -1;
                entry[2] = (int64_t)st->top_text.len;
                if (buf_put(&s->top, entry, sizeof entry)) return s->nomem = 1, -1;
                st->state = ST_TOP_AFTER;
            }
        } else if (st->state == ST_TOP_AFTER || st->state == ST_EV_AFTER) {
            int top = st->state == ST_TOP_AFTER;
            char close = top ? '}' : ']';
            s->p++;
            if (c == ',') {
                st->state = top ? ST_TOP_KEY : ST_EV;
            } else if (c == close) {
                if (top && s->events_start < 0) return fail(s, "no traceEvents");
                if (!top) s->events_end = st->offset + (s->p - s->base);
                st->state = top || st->bare ? ST_END : ST_TOP_AFTER;
            } else {
                s->p--;
                return fail(s, top ? "expected ',' or '}' at the top level"
                                   : "expected ',' or ']' between events");
            }
        } else { /* ST_EV_FIRST, ST_EV */
            if (st->state == ST_EV_FIRST && c == ']') {
                s->p++;
                s->events_end = st->offset + (s->p - s->base);
                st->state = st->bare ? ST_END : ST_TOP_AFTER;
                continue;
            }
            if (c != '{') return fail(s, "event is not an object");
            /* Near the end of the text an event's end is found first (a cut one waits for
             * the next chunk); further in it is read at once, and undone if the end of the
             * text cuts it after all (an event longer than the window). */
            const char *start = s->p, *e = NULL;
            int direct = !final && (size_t)(s->end - s->p) > st->window;
            Mark m;
            if (direct) {
                stream_mark(s, &m);
            } else {
                e = value_end(s->p, s->end);
                if (!e && !final) break; /* the event is cut: wait for the rest */
            }
            const char *end = s->end;
            if (e) s->end = e; /* the event alone: nothing past it is read */
            int rc = read_event(s);
            s->end = end;
            if (rc) {
                if (direct && !s->nomem && !value_end(start, s->end)) {
                    stream_undo(s, &m);
                    s->why[0] = 0;
                    s->p = start;
                    break;
                }
                return -1;
            }
            if (direct && (size_t)(s->p - start) * 4 > st->window)
                st->window = (size_t)(s->p - start) * 4;
            if (s->n == INT32_MAX - 1) return fail(s, "too many events");
            s->n++;
            st->state = ST_EV_AFTER;
        }
    }
    *used = (size_t)(s->p - s->base);
    return 0;
}

/* stream_run over pending, its read bytes dropped. */
static int stream_run_pending(Stream *st, int final) {
    size_t used;
    if (stream_run(st, st->pending.p, st->pending.len, final, &used)) return -1;
    if (used) {
        memmove(st->pending.p, st->pending.p + used, st->pending.len - used);
        st->pending.len -= used;
        st->offset += (int64_t)used;
    }
    return 0;
}

/* Reads a chunk of text after what pending holds, keeping the cut unit at its end in
 * pending. The chunk is read where it lies, not copied: only its first bytes are joined to
 * the cut unit pending holds (2x the window, at least 64 KiB; the whole chunk where that
 * unit is longer), and only its own cut unit is kept. Where the units fall, and so the
 * columns, are those of one pass over the whole text, as with any other cut. */
static int stream_feed(Stream *st, const char *text, size_t len) {
    size_t from = 0, used;
    if (st->pending.len) {
        size_t join = st->window * 2 > (64 << 10) ? st->window * 2 : (64 << 10);
        if (join > len) join = len;
        if (buf_put(&st->pending, text, join)) return st->s.nomem = 1, -1;
        if (stream_run_pending(st, 0)) return -1;
        if (join == len) return 0;
        if (st->pending.len > join) { /* the unit began before this chunk and is still cut */
            if (buf_put(&st->pending, text + join, len - join)) return st->s.nomem = 1, -1;
            return stream_run_pending(st, 0);
        }
        from = join - st->pending.len; /* pending holds text[from:join]: read on from there */
        st->pending.len = 0;
    }
    if (stream_run(st, text + from, len - from, 0, &used)) return -1;
    st->offset += (int64_t)used;
    if (buf_put(&st->pending, text + from + used, len - from - used)) return st->s.nomem = 1, -1;
    return 0;
}

/* ------------------------------------------------------------------ Python face */

static void scan_free(Scan *s) {
    interner_free(&s->strs);
    Buf *bufs[] = {&s->scratch, &s->raw,    &s->ph,       &s->cat,
                   &s->name,    &s->pid,    &s->tid,      &s->ts,     &s->dur,     &s->id_val,
                   &s->id_sid,  &s->arg_ev, &s->arg_key,  &s->arg_type, &s->arg_val,
                   &s->key_of_sid, &s->key_sids, &s->key_start, &s->top,
                   &s->spare_ev, &s->spare_type, &s->spare_val};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]->p);
}

/* Moves a column into the result dict as a bytearray, freeing the C copy at once. */
static int put_column(PyObject *dict, const char *key, Buf *b) {
    PyObject *arr = PyByteArray_FromStringAndSize(b->p ? b->p : "", (Py_ssize_t)b->len);
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    if (!arr) return -1;
    int rc = PyDict_SetItemString(dict, key, arr);
    Py_DECREF(arr);
    return rc;
}

static PyObject *string_list(Interner *in) {
    PyObject *list = PyList_New(in->count);
    if (!list) return NULL;
    const size_t *offs = (const size_t *)in->offs.p;
    const size_t *lens = (const size_t *)in->lens.p;
    for (int32_t i = 0; i < in->count; i++) {
        PyObject *str =
            PyUnicode_DecodeUTF8(in->arena.p + offs[i], (Py_ssize_t)lens[i], "surrogatepass");
        if (!str) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, str);
    }
    return list;
}

/* The result dict of a finished scan (columns moved out of `s`); NULL with an exception set. */
static PyObject *scan_result(Scan *s) {
    PyObject *result = PyDict_New();
    if (!result) return NULL;
    PyObject *n = PyLong_FromLongLong(s->n);
    PyObject *strings = string_list(&s->strs);
    PyObject *range = Py_BuildValue("(LL)", (long long)s->events_start, (long long)s->events_end);
    int bad_range = !range || PyDict_SetItemString(result, "events_range", range);
    Py_XDECREF(range);
    if (bad_range || !n || !strings || PyDict_SetItemString(result, "n", n) ||
        PyDict_SetItemString(result, "strings", strings)) {
        Py_XDECREF(n);
        Py_XDECREF(strings);
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            PyErr_SetString(Unsupported, "a string is not valid UTF-8");
        }
        Py_CLEAR(result);
        return result;
    }
    Py_DECREF(n);
    Py_DECREF(strings);
    struct {
        const char *key;
        Buf *buf;
    } cols[] = {{"ph", &s->ph},             {"cat", &s->cat},           {"name", &s->name},     {"pid", &s->pid},
                {"tid", &s->tid},           {"ts", &s->ts},         {"dur", &s->dur},
                {"id_val", &s->id_val},     {"id_sid", &s->id_sid}, {"arg_ev", &s->arg_ev},
                {"arg_type", &s->arg_type}, {"arg_val", &s->arg_val},
                {"arg_key_sid", &s->key_sids}, {"arg_key_start", &s->key_start},
                {"top", &s->top}};
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++) {
        if (put_column(result, cols[i].key, cols[i].buf)) {
            Py_CLEAR(result);
            return result;
        }
    }
    return result;
}

static PyObject *scan_events(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Scan *s = calloc(1, sizeof *s);
    PyObject *result = NULL;
    if (!s || interner_init(&s->strs)) {
        PyErr_NoMemory();
        goto done;
    }
    memset(s->key_memo, 0xFF, sizeof s->key_memo);
    s->base = s->p = view.buf;
    s->end = s->base + view.len;
    int ok = intern(&s->strs, "", 0) == 0;
    s->zero_id = intern(&s->strs, "0", 1);
    ok = ok && s->zero_id == 1;
    int rc = -1;
    if (ok) {
        s->unlocked = PyEval_SaveThread();
        rc = scan_trace(s);
        if (!rc && group_args(s)) s->nomem = 1;
        PyEval_RestoreThread(s->unlocked);
    }
    if (!ok || s->nomem) {
        PyErr_NoMemory();
        goto done;
    }
    if (rc) {
        PyErr_SetString(Unsupported, s->why[0] ? s->why : "unreadable trace");
        goto done;
    }
    result = scan_result(s);
done:
    if (s) {
        scan_free(s);
        free(s);
    }
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------ Scanner: in chunks */

typedef struct {
    PyObject_HEAD
    Stream *st;
    int done;
} ScannerObject;

static void stream_free(Stream *st) {
    if (!st) return;
    scan_free(&st->s);
    free(st->pending.p);
    free(st->top_text.p);
    free(st);
}

static int Scanner_init(ScannerObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"window", NULL};
    /* Events within `window` of a chunk's end are found whole (value_end) before they are
     * read: a second pass over those bytes. 64 KiB, not 1 MiB: with 8 MB chunks the
     * scanner ran 5% fewer instructions over the 10x copy's text (callgrind), and an event
     * longer than the window still reads right (read at once, undone when cut; the window
     * then grows to 4x that event). */
    Py_ssize_t window = 64 << 10;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n:Scanner", kwlist, &window)) return -1;
    if (window < 0) {
        PyErr_SetString(PyExc_ValueError, "window must be >= 0");
        return -1;
    }
    stream_free(self->st);
    self->done = 0;
    self->st = calloc(1, sizeof *self->st);
    if (!self->st || interner_init(&self->st->s.strs)) {
        PyErr_NoMemory();
        return -1;
    }
    self->st->window = (size_t)window;
    Scan *s = &self->st->s;
    memset(s->key_memo, 0xFF, sizeof s->key_memo);
    s->events_start = s->events_end = -1;
    if (intern(&s->strs, "", 0) != 0 || (s->zero_id = intern(&s->strs, "0", 1)) != 1) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void Scanner_dealloc(ScannerObject *self) {
    stream_free(self->st);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Reads a chunk fed (text) or, with `final`, what pending holds at the end, the GIL
 * released; raises on an error. */
static int scanner_step(ScannerObject *self, const char *text, size_t len, int final) {
    Stream *st = self->st;
    st->s.unlocked = PyEval_SaveThread();
    int rc = final ? stream_run_pending(st, 1) : stream_feed(st, text, len);
    if (!rc && final && group_args(&st->s)) st->s.nomem = 1, rc = -1;
    PyEval_RestoreThread(st->s.unlocked);
    if (rc) {
        self->done = 1;
        if (st->s.nomem) PyErr_NoMemory();
        else PyErr_SetString(Unsupported, st->s.why[0] ? st->s.why : "unreadable trace");
        return -1;
    }
    return 0;
}

static int scanner_usable(ScannerObject *self) {
    if (!self->st || self->done) {
        PyErr_SetString(PyExc_RuntimeError, "the scanner has finished");
        return 0;
    }
    return 1;
}

static PyObject *Scanner_feed(ScannerObject *self, PyObject *arg) {
    if (!scanner_usable(self)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    int bad = scanner_step(self, view.buf, (size_t)view.len, 0);
    PyBuffer_Release(&view);
    if (bad) return NULL;
    return PyLong_FromSize_t(self->st->pending.len);
}

static PyObject *Scanner_finish(ScannerObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!scanner_usable(self)) return NULL;
    if (scanner_step(self, NULL, 0, 1)) return NULL;
    self->done = 1;
    PyObject *result = scan_result(&self->st->s);
    if (!result) return NULL;
    PyObject *top = PyBytes_FromStringAndSize(self->st->top_text.p ? self->st->top_text.p : "",
                                              (Py_ssize_t)self->st->top_text.len);
    if (!top || PyDict_SetItemString(result, "top_text", top)) {
        Py_XDECREF(top);
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(top);
    stream_free(self->st);
    self->st = NULL;
    return result;
}

/* A new bytearray of `len` bytes in `dict` under `key`, filled later (without the GIL);
 * NULL with an exception set. */
static char *new_column(PyObject *dict, const char *key, size_t len) {
    PyObject *arr = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!arr) return NULL;
    int rc = PyDict_SetItemString(dict, key, arr);
    Py_DECREF(arr);
    return rc ? NULL : PyByteArray_AS_STRING(arr);
}

/* The events read since the last take, as bytearrays (`first`, `n`, the strings new since
 * `strings_from`, the columns), each column then emptied but its memory kept for the next
 * batch (which then grows it no further). With `grouped`, the arguments come grouped by
 * key (`arg_key_start`, no `arg_key`), straight into the bytearray that returns them. The
 * columns are made with the GIL and filled without it. */
static PyObject *Scanner_take(ScannerObject *self, PyObject *args) {
    if (!scanner_usable(self)) return NULL;
    Py_ssize_t strings_from;
    int grouped = 0;
    if (!PyArg_ParseTuple(args, "n|p", &strings_from, &grouped)) return NULL;
    Scan *s = &self->st->s;
    if (strings_from < 0 || strings_from > s->strs.count) {
        PyErr_SetString(PyExc_ValueError, "strings_from out of range");
        return NULL;
    }
    int64_t count = (int64_t)(s->ph.len / sizeof(int32_t));
    PyObject *result = PyDict_New();
    if (!result) return NULL;
    PyObject *first = PyLong_FromLongLong(s->n - count);
    PyObject *n = PyLong_FromLongLong(count);
    PyObject *strings = PyList_New(s->strs.count - strings_from);
    int bad = !first || !n || !strings || PyDict_SetItemString(result, "first", first) ||
              PyDict_SetItemString(result, "n", n);
    Py_XDECREF(first);
    Py_XDECREF(n);
    if (!bad) {
        const size_t *offs = (const size_t *)s->strs.offs.p;
        const size_t *lens = (const size_t *)s->strs.lens.p;
        for (int32_t i = (int32_t)strings_from; i < s->strs.count; i++) {
            PyObject *str = PyUnicode_DecodeUTF8(s->strs.arena.p + offs[i], (Py_ssize_t)lens[i],
                                                 "surrogatepass");
            if (!str) {
                bad = 1;
                break;
            }
            PyList_SET_ITEM(strings, i - strings_from, str);
        }
    }
    bad = bad || PyDict_SetItemString(result, "strings", strings);
    Py_XDECREF(strings);
    if (bad) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            PyErr_SetString(Unsupported, "a string is not valid UTF-8");
        }
        Py_DECREF(result);
        return NULL;
    }
    struct {
        const char *key;
        Buf *buf;
        char *dst;
    } cols[] = {{"ph", &s->ph},           {"cat", &s->cat},
                {"name", &s->name},       {"pid", &s->pid},
                {"tid", &s->tid},         {"ts", &s->ts},
                {"dur", &s->dur},         {"id_val", &s->id_val},
                {"id_sid", &s->id_sid},   {"arg_ev", &s->arg_ev},
                {"arg_key", &s->arg_key}, {"arg_type", &s->arg_type},
                {"arg_val", &s->arg_val}, {"arg_key_start", &s->key_start},
                {"arg_key_sid", &s->key_sids}};
    enum { ARG_EV = 9, ARG_KEY, ARG_TYPE, ARG_VAL, KEY_START, KEY_SIDS, N_COLS };
    size_t nkeys = s->key_sids.len / sizeof(int32_t);
    for (int i = 0; i < N_COLS; i++) {
        size_t len = cols[i].buf->len;
        if (i == ARG_KEY && grouped) continue; /* emptied by the grouping */
        if (i == KEY_START) {
            if (!grouped) continue;
            len = (nkeys + 1) * sizeof(int64_t);
        }
        if (!(cols[i].dst = new_column(result, cols[i].key, len))) {
            Py_DECREF(result);
            return NULL;
        }
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (grouped)
        failed = group_args_into(s, (int32_t *)cols[ARG_EV].dst, (uint8_t *)cols[ARG_TYPE].dst,
                                 (int64_t *)cols[ARG_VAL].dst, (int64_t *)cols[KEY_START].dst);
    for (int i = 0; i < N_COLS && !failed; i++) {
        Buf *b = cols[i].buf;
        int placed = grouped && (i == ARG_EV || i == ARG_TYPE || i == ARG_VAL);
        if (cols[i].dst && !placed && i != KEY_START && b->len) memcpy(cols[i].dst, b->p, b->len);
        if (i != KEY_SIDS) b->len = 0; /* the keys are numbered on across batches */
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        Py_DECREF(result);
        return PyErr_NoMemory();
    }
    return result;
}

static PyObject *Scanner_events_read(ScannerObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!scanner_usable(self)) return NULL;
    return PyLong_FromLongLong(self->st->s.n);
}

static PyMethodDef scanner_methods[] = {
    {"feed", (PyCFunction)Scanner_feed, METH_O,
     "feed(buffer) -> int: reads the next chunk of the trace's text as far as it holds whole "
     "units; returns the bytes kept for the next chunk (a cut event or member)."},
    {"events_read", (PyCFunction)Scanner_events_read, METH_NOARGS,
     "events_read() -> int: the events read so far, taken or not."},
    {"take", (PyCFunction)Scanner_take, METH_VARARGS,
     "take(strings_from, grouped=False) -> dict: the events read so far and not taken yet, "
     "as columns, handed over (the scanner keeps its string table and argument keys): first "
     "(index of the first event), n, strings (the string table from id strings_from on), ph, "
     "cat, name, pid, tid, ts, dur, id_val, id_sid, and one row per argument in event order: "
     "arg_ev (event index in the whole trace), arg_key (the key's number, an index into "
     "arg_key_sid, every key so far), arg_type, arg_val. grouped: the arguments grouped by "
     "key instead, in event order within a key, as finish() gives them: arg_key_start "
     "(where each key's rows start, one more than the keys so far) in place of arg_key. "
     "finish() then returns only what came after the last take."},
    {"finish", (PyCFunction)Scanner_finish, METH_NOARGS,
     "finish() -> dict: the columns, as scan_events returns them, but `top` ranges index "
     "`top_text` (the other top-level values, back to back) and events_range counts bytes of "
     "the whole text. Raises Unsupported where scan_events would."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_kineto_scan.Scanner",
    .tp_basicsize = sizeof(ScannerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Scanner(window=64 KiB): scan_events over a trace given in chunks (feed, then "
              "finish); the same columns as one call on the whole text, holding only the "
              "columns and the cut unit at the end of the last chunk. Events starting within "
              "`window` bytes of a chunk's end are checked whole before they are read; "
              "further in they are read at once and undone when cut (0: undo every cut one).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Scanner_init,
    .tp_dealloc = (destructor)Scanner_dealloc,
    .tp_methods = scanner_methods,
};

/* ------------------------------------------------------------------ span helper */

/* previous_greater_equal(int64 buffer) -> bytearray of int64: for each i, the largest j < i
 * with values[j] >= values[i], or -1 (kineto_span.previous_greater_equal, whose numpy form
 * takes O(n log n); this is the monotonic stack, O(n), the GIL released). */
static PyObject *previous_greater_equal(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer in;
    if (PyObject_GetBuffer(arg, &in, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (in.itemsize != 8 || !in.format || (strcmp(in.format, "l") && strcmp(in.format, "q") &&
                                           strcmp(in.format, "<q") && strcmp(in.format, "<l"))) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_TypeError, "previous_greater_equal takes int64 values");
        return NULL;
    }
    Py_ssize_t n = in.len / 8;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * 8);
    int64_t *stack = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!out || !stack) {
        Py_XDECREF(out);
        free(stack);
        PyBuffer_Release(&in);
        return PyErr_NoMemory();
    }
    const int64_t *v = in.buf;
    int64_t *res = (int64_t *)PyByteArray_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t top = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        while (top > 0 && v[stack[top - 1]] < v[i]) top--;
        res[i] = top ? stack[top - 1] : -1;
        stack[top++] = i;
    }
    Py_END_ALLOW_THREADS
    free(stack);
    PyBuffer_Release(&in);
    return out;
}

static int compare_int64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* compact_strings(sources, outs, ids, marks) -> count: the string ids a step uses, in a table
 * of its own. sources: int32 string ids (a tuple of buffers); outs: int32, one per source and
 * of its length, where each id's number in the step's table is written; ids: int64, room for
 * the table, where its ids are written in ascending order, 0 (the empty string) always
 * among them; marks: int32, one per string of the file, all -1 (and left so). Returns the
 * table's length. One pass without the GIL; what kineto_span._split_steps did in some
 * twenty numpy calls per step, holding the GIL (cutting the 50x copy's 99 steps took 23-27
 * ms so, 11-12 ms with this). Raises
 * ValueError on an id out of range or buffers of the wrong size, writing nothing past
 * their ends. */
static PyObject *compact_strings(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sources, *outs;
    Py_buffer ids_buf, marks_buf;
    if (!PyArg_ParseTuple(args, "O!O!w*w*", &PyTuple_Type, &sources, &PyTuple_Type, &outs,
                          &ids_buf, &marks_buf))
        return NULL;
    Py_ssize_t n_src = PyTuple_GET_SIZE(sources);
    Py_buffer *b = calloc((size_t)(2 * n_src + 1), sizeof(Py_buffer));
    Py_ssize_t got = 0;
    int nomem = !b, bad = nomem || PyTuple_GET_SIZE(outs) != n_src;
    for (Py_ssize_t i = 0; !bad && i < n_src; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(sources, i), &b[got], PyBUF_SIMPLE) < 0) break;
        got++;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs, i), &b[got], PyBUF_WRITABLE) < 0) break;
        got++;
        bad = b[got - 2].len != b[got - 1].len || b[got - 1].len % 4;
    }
    Py_ssize_t count = 0;
    int32_t *marks = marks_buf.buf;
    int64_t *ids = ids_buf.buf;
    Py_ssize_t n = marks_buf.len / 4, room = ids_buf.len / 8;
    if (!PyErr_Occurred() && !bad) {
        bad = n < 1 || room < 1;
        Py_BEGIN_ALLOW_THREADS
        if (!bad) {
            marks[0] = 0;
            ids[count++] = 0;
        }
        for (Py_ssize_t i = 0; !bad && i < n_src; i++) {
            const int32_t *v = b[2 * i].buf;
            for (Py_ssize_t j = 0, m = b[2 * i].len / 4; j < m; j++) {
                if ((uint32_t)v[j] >= (uint64_t)n) {
                    bad = 1;
                    break;
                }
                if (marks[v[j]] < 0) {
                    if (count == room) {
                        bad = 1;
                        break;
                    }
                    marks[v[j]] = 0;
                    ids[count++] = v[j];
                }
            }
        }
        if (!bad) {
            if ((size_t)n <= 8 * (size_t)count + 4096) { /* the marks in order */
                Py_ssize_t k = 0;
                for (Py_ssize_t i = 0; i < n; i++)
                    if (marks[i] == 0) ids[k++] = i;
            } else {
                qsort(ids, (size_t)count, sizeof(int64_t), compare_int64);
            }
            for (Py_ssize_t k = 0; k < count; k++) marks[ids[k]] = (int32_t)k;
            for (Py_ssize_t i = 0; i < n_src; i++) {
                const int32_t *v = b[2 * i].buf;
                int32_t *out = b[2 * i + 1].buf;
                for (Py_ssize_t j = 0, m = b[2 * i].len / 4; j < m; j++) out[j] = marks[v[j]];
            }
        }
        for (Py_ssize_t k = 0; k < count; k++) marks[ids[k]] = -1;
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&b[i]);
    free(b);
    PyBuffer_Release(&ids_buf);
    PyBuffer_Release(&marks_buf);
    if (PyErr_Occurred()) return NULL;
    if (bad) {
        PyErr_SetString(nomem ? PyExc_MemoryError : PyExc_ValueError,
                        "compact_strings: a string id out of range, or buffers of the wrong size");
        return NULL;
    }
    return PyLong_FromSsize_t(count);
}

/* place_args(starts, ev, types, values, ids, key_ids, dest, shift, out_ev, out_type, out_val):
 * one scanner batch's arguments, grouped by the batch's key numbers (starts: int64, one more
 * than its keys), copied into the merged columns: key k's arguments go from out position
 * dest[key_ids[k]] on (dest: int64 per merged key; key_ids: int32), each event number plus
 * `shift`, each string value (T_STR, T_RAW, T_BIGINT) renumbered by ids (int32). One pass
 * without the GIL; what kineto_split_scan._merged did key by key in numpy. Raises
 * ValueError, writing nothing past the ends, on numbers out of range. */
static PyObject *place_args(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b[10];
    long long shift;
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*Lw*w*w*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5],
                          &b[6], &shift, &b[7], &b[8], &b[9]))
        return NULL;
    const int64_t *starts = b[0].buf;
    const int32_t *ev = b[1].buf;
    const uint8_t *types = b[2].buf;
    const int64_t *values = b[3].buf;
    const int32_t *ids = b[4].buf;
    const int32_t *key_ids = b[5].buf;
    const int64_t *dest = b[6].buf;
    int32_t *out_ev = b[7].buf;
    uint8_t *out_type = b[8].buf;
    int64_t *out_val = b[9].buf;
    Py_ssize_t n_keys = b[0].len / 8 - 1, n_args = b[2].len, n_ids = b[4].len / 4;
    Py_ssize_t n_key_ids = b[5].len / 4, n_dest = b[6].len / 8, n_out = b[8].len;
    int bad = b[1].len != n_args * 4 || b[3].len != n_args * 8 || b[7].len != n_out * 4 ||
              b[9].len != n_out * 8 || n_keys > n_key_ids;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; !bad && k < n_keys; k++) {
        int64_t a = starts[k], e = starts[k + 1];
        if (a == e) continue;
        int32_t key = key_ids[k];
        if (a < 0 || e < a || e > n_args || key < 0 || key >= n_dest) {
            bad = 1;
            break;
        }
        int64_t to = dest[key];
        if (to < 0 || to + (e - a) > n_out) {
            bad = 1;
            break;
        }
        for (int64_t i = a; i < e; i++, to++) {
            uint8_t t = types[i];
            int64_t v = values[i];
            if (t == T_STR || t == T_RAW || t == T_BIGINT) {
                if (v < 0 || v >= n_ids) {
                    bad = 1;
                    break;
                }
                v = ids[v];
            }
            out_ev[to] = (int32_t)(ev[i] + shift);
            out_type[to] = t;
            out_val[to] = v;
        }
    }
    Py_END_ALLOW_THREADS
    for (int i = 0; i < 10; i++) PyBuffer_Release(&b[i]);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "place_args: an argument, key or string out of range");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"compact_strings", compact_strings, METH_VARARGS,
     "compact_strings(sources, outs, ids, marks) -> count: the string ids a step uses, "
     "renumbered into a table of its own (see the source)."},
    {"place_args", place_args, METH_VARARGS,
     "place_args(starts, ev, types, values, ids, key_ids, dest, shift, out_ev, out_type, "
     "out_val): one batch's arguments copied into the merged columns (see the source)."},
    {"previous_greater_equal", previous_greater_equal, METH_O,
     "previous_greater_equal(int64 buffer) -> bytearray of int64: for each i the largest "
     "j < i with values[j] >= values[i], or -1."},
    {"scan_events", scan_events, METH_O,
     "scan_events(buffer) -> dict of columns: the JSON text of a trace (an object with "
     "traceEvents, or a list of events), read in one pass (see the module source for the "
     "columns). Raises Unsupported for input this scanner does not read; the pure-Python "
     "path then takes it."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_kineto_scan", "Kineto traceEvents -> columns, in C.", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__kineto_scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Unsupported = PyErr_NewException("_kineto_scan.Unsupported", PyExc_ValueError, NULL);
    if (!Unsupported || PyModule_AddObject(m, "Unsupported", Unsupported)) {
        Py_XDECREF(Unsupported);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(Unsupported);
    if (PyType_Ready(&ScannerType) < 0) return NULL;
    Py_INCREF(&ScannerType);
    if (PyModule_AddObject(m, "Scanner", (PyObject *)&ScannerType)) {
        Py_DECREF(&ScannerType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "T_NULL", T_NULL);
    PyModule_AddIntConstant(m, "T_FALSE", T_FALSE);
    PyModule_AddIntConstant(m, "T_TRUE", T_TRUE);
    PyModule_AddIntConstant(m, "T_INT", T_INT);
    PyModule_AddIntConstant(m, "T_FLOAT", T_FLOAT);
    PyModule_AddIntConstant(m, "T_STR", T_STR);
    PyModule_AddIntConstant(m, "T_RAW", T_RAW);
    PyModule_AddIntConstant(m, "T_BIGINT", T_BIGINT);
    return m;
}
