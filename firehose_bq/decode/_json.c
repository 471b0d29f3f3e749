/* JSON documents -> Arrow buffers in the destination table's columns: one pass per document, straight
 * from the bytes into per-column buffers, driven by a table of the columns built once per schema.
 *
 * The rules are json_rules.py's and json_reference.py is the reference; a differential test checks that
 * both give the same rows, failures and unknown-field lists. No Python object is made per row or field:
 * the buffers are handed to pyarrow as they are (json_native.py assembles the arrays), failures are
 * collected as C records and turned into Python objects once per failed row.
 *
 * A row that fails is rolled back: every column's lengths are saved when the row starts and restored if
 * it fails, then the row is written as NULL. A value that does not fit its column stops the typed walk;
 * the document is then read once more only to check it is JSON (DESERIALIZATION_ERROR wins over
 * INVALID_MESSAGE_ERROR, as it does in the reference where `json` parses before anything is coerced).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__APPLE__)
#include <xlocale.h>
#endif

#if !defined(__SIZEOF_INT128__)
#error "a 128-bit integer type is needed for NUMERIC; the Python decoder is used instead"
#endif
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "Arrow buffers are written little-endian; the Python decoder is used instead"
#endif

/* Shared with json_rules.py (Kind, Mode, Problem, JsonType); json_native.py checks they agree. */
enum { K_RECORD, K_STRING, K_BYTES, K_INTEGER, K_FLOAT, K_BOOLEAN, K_TIMESTAMP, K_DATE, K_NUMERIC, K_BIGNUMERIC,
       K_DATETIME, K_TIME, K_JSON, K_GEOGRAPHY, K_INTERVAL, K_COUNT };
enum { M_NULLABLE, M_REQUIRED, M_REPEATED };
enum { P_NO_COERCION = 1, P_NOT_AN_ARRAY, P_REQUIRED_MISSING, P_NULL_ELEMENT, P_DUPLICATE_KEY, P_NOT_A_NUMBER,
       P_NOT_WHOLE, P_OUT_OF_RANGE, P_TOO_PRECISE, P_NOT_BOOLEAN, P_BAD_TIMESTAMP, P_TIMESTAMP_RANGE, P_BAD_DATE,
       P_BAD_DATETIME, P_BAD_TIME, P_BAD_BASE64, P_JSON_NUMBER_RANGE };
enum { J_NULL, J_BOOLEAN, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT };

/* How a row ended. */
enum { F_NONE, F_DESER, F_INVALID, F_NOMEM, F_TOO_BIG };

#define ERR (-1)
/* Exponents are read up to this size (json_reference._EXPONENT_CAP): past it every verdict is decided. */
#define EXPONENT_CAP 1000000000000000LL
#define TS_MIN (-62135596800000000LL)
#define TS_MAX 253402300799999999LL

/* ---- growable byte buffers ------------------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t extra) {
    size_t want = b->len + extra;
    if (want <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < want) {
        if (cap > SIZE_MAX / 2) return ERR;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return ERR;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (n && buf_reserve(b, n)) return ERR;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_byte(Buf *b, uint8_t c) {
    if (b->len == b->cap && buf_reserve(b, 1)) return ERR;
    b->p[b->len++] = c;
    return 0;
}

/* Make bytes [0, size) addressable (zeroing new ones) without changing what `len` means to the caller. */
static int buf_cover(Buf *b, size_t size) {
    if (size <= b->len) return 0;
    if (buf_reserve(b, size - b->len)) return ERR;
    memset(b->p + b->len, 0, size - b->len);
    b->len = size;
    return 0;
}

static int bit_set(Buf *b, size_t i, int v) {
    if (buf_cover(b, (i >> 3) + 1)) return ERR;
    if (v) b->p[i >> 3] |= (uint8_t)(1u << (i & 7));
    else b->p[i >> 3] &= (uint8_t)~(1u << (i & 7));
    return 0;
}

/* int32 offsets: entry i at bytes [4i, 4i+4). */
static int offset_set(Buf *b, size_t i, size_t v) {
    if (v > INT32_MAX) return ERR;
    if (buf_cover(b, (i + 1) * 4)) return ERR;
    int32_t o = (int32_t)v;
    memcpy(b->p + i * 4, &o, 4);
    return 0;
}

/* ---- the column table ----------------------------------------------------------------------------- */

typedef struct {
    int kind, mode;
    int width; /* bytes per value of fixed-width kinds; 0 for variable-width and records; -1 for bool */
    int nchildren;
    int *children;
    int map_key, map_value; /* child node indexes of a map column, else -1 */
    uint32_t mask;          /* children's hash table: mask + 1 slots of child indexes (-1 empty) */
    int *table;
    char *name; /* UTF-8, for paths */
    Py_ssize_t name_len;
    char *folded; /* ASCII-lowercased name: what renamed keys are compared to */
    Py_ssize_t folded_len;
} Node;

typedef struct {
    PyObject_HEAD
    Node *nodes;
    int nnodes;
    int ap_node; /* the top-level column that receives unknown values, or -1 */
    int max_depth;
    int max_path; /* path entries a row can need: two per schema level */
    char too_deep[96];
} Decoder;

/* ---- per-call state ------------------------------------------------------------------------------- */

typedef struct {
    size_t len, nulls; /* value slots (items of a REPEATED column) and NULLs among them */
    Buf validity;      /* NULLABLE columns only */
    Buf data;          /* fixed-width values, bool bits, or the bytes of variable-width ones */
    Buf offsets;       /* variable-width kinds: len + 1 int32 */
    size_t list_len;   /* REPEATED columns: lists, with len + 1 int32 list offsets */
    Buf list_offsets;
    const uint8_t *key; /* the raw key that last landed on this column (for a duplicate's message) */
    size_t key_len;
    int key_escaped;
} Col;

typedef struct {
    size_t len, nulls, data_len, list_len;
} Snap;

typedef struct {
    int node;
    Py_ssize_t index; /* -1: the column itself; else an element of it */
} Step;

typedef struct {
    Py_ssize_t row;
    int failure, problem, node, json_type;
    size_t at; /* DESER: byte offset of the problem */
    const char *reason;
    size_t path, path_len, key1, key1_len, key2, key2_len; /* spans of the failures' text arena */
} Failure;

typedef struct {
    const Decoder *d;
    Col *cols;
    Snap *snaps;
    const uint8_t *start, *p, *end;
    int depth;
    int unknown;
    /* the row's failure */
    int failure, problem, err_node, err_json;
    const char *reason;
    size_t at;
    Step *path;
    int path_len;
    const uint8_t *dup_key; /* a duplicate's earlier key */
    size_t dup_len;
    int dup_escaped;
    const uint8_t *dup_key2;
    size_t dup_len2;
    int dup_escaped2;
    Buf mirror; /* the row's unknown values, as a JSON object */
    Buf str;    /* a decoded JSON string */
    Buf key;    /* a decoded object key, renamed */
    Buf num;    /* digits of a number */
    Buf arena;  /* failures' texts */
    Failure *fails;
    size_t nfails, capfails;
    Buf unknown_rows; /* int64 row indexes */
} St;

static locale_t c_locale;

/* ---- failures ------------------------------------------------------------------------------------- */

static int deser(St *st, const char *reason) {
    if (st->failure == F_NONE || st->failure == F_INVALID) {
        st->failure = F_DESER;
        st->reason = reason;
        st->at = (size_t)(st->p - st->start);
    }
    return ERR;
}

static int nomem(St *st) {
    st->failure = F_NOMEM;
    return ERR;
}

static int invalid(St *st, int problem, int node, int json_type) {
    st->failure = F_INVALID;
    st->problem = problem;
    st->err_node = node;
    st->err_json = json_type;
    return ERR;
}

static inline int push(St *st, int node, Py_ssize_t index) {
    st->path[st->path_len].node = node;
    st->path[st->path_len].index = index;
    st->path_len++;
    return 0;
}

static inline void pop(St *st) { st->path_len--; }

static int json_type_of(uint8_t c) {
    switch (c) {
    case '{': return J_OBJECT;
    case '[': return J_ARRAY;
    case '"': return J_STRING;
    case 't': case 'f': return J_BOOLEAN;
    case 'n': return J_NULL;
    default: return J_NUMBER;
    }
}

/* ---- lexing --------------------------------------------------------------------------------------- */

static inline void skip_ws(St *st) {
    const uint8_t *p = st->p, *end = st->end;
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    st->p = p;
}

/* 1 for bytes a string can hold as they are: ASCII but '"', '\\' and control characters. */
static uint8_t plain_byte[256];

static int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int hex4(const uint8_t *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Length of the valid UTF-8 sequence at p (a lead byte >= 0x80), 0 if invalid: no overlong forms, no
 * surrogates, nothing past U+10FFFF (what Python's strict UTF-8 codec accepts). */
static size_t utf8_len(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    size_t n = (size_t)(end - p);
    if (c >= 0xC2 && c <= 0xDF) return n >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (n < 3 || (p[2] & 0xC0) != 0x80) return 0;
        uint8_t lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return p[1] >= lo && p[1] <= hi ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (n < 4 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        uint8_t lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return p[1] >= lo && p[1] <= hi ? 4 : 0;
    }
    return 0;
}

/* At '"': checks the string and steps past it. Its raw content is [*s, *s + *n); *escaped says whether it
 * holds escapes (else the raw bytes are the value). */
static int scan_string(St *st, const uint8_t **s, size_t *n, int *escaped) {
    const uint8_t *p = st->p + 1, *end = st->end;
    int esc = 0;
    *s = p;
    for (;;) {
        while (p < end && plain_byte[*p]) p++;
        if (p >= end) {
            st->p = p;
            return deser(st, "not JSON: unterminated string");
        }
        uint8_t c = *p;
        if (c == '"') break;
        if (c == '\\') {
            esc = 1;
            if (end - p < 2) {
                st->p = p;
                return deser(st, "not JSON: unterminated string");
            }
            uint8_t e = p[1];
            if (e == 'u') {
                int cp = end - p >= 6 ? hex4(p + 2) : -1;
                if (cp < 0) {
                    st->p = p;
                    return deser(st, "not JSON: bad \\u escape");
                }
                if (cp >= 0xDC00 && cp <= 0xDFFF) {
                    st->p = p;
                    return deser(st, "not JSON text: a lone UTF-16 surrogate escape");
                }
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    int lo = end - p >= 12 && p[6] == '\\' && p[7] == 'u' ? hex4(p + 8) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) {
                        st->p = p;
                        return deser(st, "not JSON text: a lone UTF-16 surrogate escape");
                    }
                    p += 12;
                } else {
                    p += 6;
                }
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                       e == 't') {
                p += 2;
            } else {
                st->p = p;
                return deser(st, "not JSON: bad escape");
            }
        } else if (c < 0x20) {
            st->p = p;
            return deser(st, "not JSON: a control character in a string");
        } else {
            size_t k = utf8_len(p, end);
            if (!k) {
                st->p = p;
                return deser(st, "not UTF-8");
            }
            p += k;
        }
    }
    *n = (size_t)(p - *s);
    *escaped = esc;
    st->p = p + 1;
    return 0;
}

static int put_utf8(Buf *out, uint32_t cp) {
    uint8_t b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | (cp >> 6));
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | (cp >> 12));
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (uint8_t)(0xF0 | (cp >> 18));
        b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return buf_put(out, b, n);
}

/* Appends the value of a checked string's raw content (escapes resolved). */
static int unescape(Buf *out, const uint8_t *s, size_t n) {
    const uint8_t *p = s, *end = s + n;
    while (p < end) {
        const uint8_t *run = p;
        while (p < end && *p != '\\') p++;
        if (buf_put(out, run, (size_t)(p - run))) return ERR;
        if (p >= end) break;
        uint8_t e = p[1], c;
        if (e == 'u') {
            uint32_t cp = (uint32_t)hex4(p + 2);
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)hex4(p + 2) - 0xDC00);
                p += 6;
            }
            if (put_utf8(out, cp)) return ERR;
            continue;
        }
        switch (e) {
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        default: c = e; break; /* '"', '\\', '/' */
        }
        if (buf_byte(out, c)) return ERR;
        p += 2;
    }
    return 0;
}

/* A checked string's value: its raw bytes, or (with escapes) resolved into st->str. */
static int decoded(St *st, const uint8_t *raw, size_t len, int escaped, const uint8_t **s, size_t *n) {
    *s = raw;
    *n = len;
    if (!escaped) return 0;
    st->str.len = 0;
    if (unescape(&st->str, raw, len)) return nomem(st);
    *s = st->str.p;
    *n = st->str.len;
    return 0;
}

/* Appends `s` as a JSON string, escaping only what JSON requires (as Python's json.dumps with
 * ensure_ascii=False does): '"', '\\' and control characters. */
static int put_json_string(Buf *out, const uint8_t *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (buf_byte(out, '"')) return ERR;
    const uint8_t *p = s, *end = s + n;
    while (p < end) {
        const uint8_t *run = p;
        while (p < end && *p >= 0x20 && *p != '"' && *p != '\\') p++;
        if (buf_put(out, run, (size_t)(p - run))) return ERR;
        if (p >= end) break;
        uint8_t c = *p++;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        size_t k = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            k = 6;
        }
        if (buf_put(out, esc, k)) return ERR;
    }
    return buf_byte(out, '"');
}

/* A checked string's raw content, written as a compact JSON string. Without escapes the raw bytes are
 * already that: they hold no '"', '\\' or control characters. */
static int put_raw_string(St *st, Buf *out, const uint8_t *s, size_t n, int escaped) {
    if (!escaped) {
        if (buf_reserve(out, n + 2)) return ERR;
        out->p[out->len++] = '"';
        memcpy(out->p + out->len, s, n);
        out->len += n;
        out->p[out->len++] = '"';
        return 0;
    }
    st->str.len = 0;
    if (unescape(&st->str, s, n)) return ERR;
    return put_json_string(out, st->str.p, st->str.len);
}

typedef struct {
    const uint8_t *s; /* the number's text */
    size_t n;
    int neg;
    const uint8_t *ip, *fp; /* integer and fraction digits */
    size_t il, fl;
    long long exp; /* capped at +-EXPONENT_CAP */
} Num;

static inline int is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* The JSON number at [p, end) (RFC 8259's grammar); its length, 0 if there is none. A '.' or exponent
 * not followed by digits ends the number before it (then whatever follows is not JSON). */
static size_t scan_number(const uint8_t *p, const uint8_t *end, Num *x) {
    const uint8_t *q = p;
    x->s = p;
    x->neg = 0;
    x->fl = 0;
    x->fp = NULL;
    x->exp = 0;
    if (q < end && *q == '-') {
        x->neg = 1;
        q++;
    }
    if (q >= end || !is_digit(*q)) return 0;
    x->ip = q;
    if (*q == '0') {
        q++;
    } else {
        while (q < end && is_digit(*q)) q++;
    }
    x->il = (size_t)(q - x->ip);
    if (q + 1 < end && *q == '.' && is_digit(q[1])) {
        x->fp = ++q;
        while (q < end && is_digit(*q)) q++;
        x->fl = (size_t)(q - x->fp);
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        const uint8_t *r = q + 1;
        int eneg = 0;
        if (r < end && (*r == '+' || *r == '-')) eneg = *r++ == '-';
        if (r < end && is_digit(*r)) {
            long long e = 0;
            while (r < end && is_digit(*r)) {
                if (e < EXPONENT_CAP) e = e * 10 + (*r - '0');
                if (e > EXPONENT_CAP) e = EXPONENT_CAP;
                r++;
            }
            x->exp = eneg ? -e : e;
            q = r;
        }
    }
    x->n = (size_t)(q - p);
    return x->n;
}

/* The number's exact value as significant digits (no leading or trailing zeros; none for zero) times
 * 10^*e. The digits are put in st->num. */
static int num_parts(St *st, const Num *x, size_t *nd, long long *e) {
    Buf *b = &st->num;
    b->len = 0;
    if (buf_put(b, x->ip, x->il) || buf_put(b, x->fp, x->fl)) return nomem(st);
    size_t lead = 0;
    while (lead < b->len && b->p[lead] == '0') lead++;
    size_t last = b->len;
    while (last > lead && b->p[last - 1] == '0') last--;
    memmove(b->p, b->p + lead, last - lead);
    *nd = last - lead;
    *e = x->exp - (long long)x->fl + (long long)(b->len - last);
    return 0;
}

/* ---- column appends ------------------------------------------------------------------------------- */

static inline size_t slots(const Node *nd, const Col *c) { return nd->mode == M_REPEATED ? c->list_len : c->len; }

static int finish_slot(St *st, const Node *nd, Col *c, int valid) {
    if (nd->mode == M_NULLABLE) {
        if (bit_set(&c->validity, c->len, valid)) return nomem(st);
        c->nulls += !valid;
    }
    c->len++;
    return 0;
}

static int put_fixed(St *st, const Node *nd, Col *c, const void *v) {
    size_t w = (size_t)nd->width;
    c->data.len = c->len * w;
    if (buf_put(&c->data, v, w)) return nomem(st);
    return finish_slot(st, nd, c, 1);
}

static int put_bool(St *st, const Node *nd, Col *c, int v) {
    if (bit_set(&c->data, c->len, v)) return nomem(st);
    return finish_slot(st, nd, c, 1);
}

/* A variable-width value whose bytes were just appended to c->data. */
static int end_var(St *st, const Node *nd, Col *c) {
    if (c->data.len > INT32_MAX) {
        st->failure = F_TOO_BIG;
        return ERR;
    }
    if (offset_set(&c->offsets, c->len + 1, c->data.len)) return nomem(st);
    return finish_slot(st, nd, c, 1);
}

static int put_var(St *st, const Node *nd, Col *c, const void *s, size_t n) {
    if (buf_put(&c->data, s, n)) return nomem(st);
    return end_var(st, nd, c);
}

static int end_list(St *st, Col *c) {
    if (c->len > INT32_MAX) {
        st->failure = F_TOO_BIG;
        return ERR;
    }
    if (offset_set(&c->list_offsets, c->list_len + 1, c->len)) return nomem(st);
    c->list_len++;
    return 0;
}

/* A slot with no value: the empty list for REPEATED, else NULL (or, under a NULL parent, a REQUIRED
 * column's placeholder, which Arrow needs and nobody reads). */
static int put_absent(St *st, int ni) {
    const Node *nd = &st->d->nodes[ni];
    Col *c = &st->cols[ni];
    if (nd->mode == M_REPEATED) return end_list(st, c);
    if (nd->kind == K_RECORD) {
        for (int k = 0; k < nd->nchildren; k++)
            if (put_absent(st, nd->children[k])) return ERR;
    } else if (nd->width > 0) {
        if (buf_cover(&c->data, (c->len + 1) * (size_t)nd->width)) return nomem(st);
        memset(c->data.p + c->len * (size_t)nd->width, 0, (size_t)nd->width);
        c->data.len = (c->len + 1) * (size_t)nd->width;
    } else if (nd->width < 0) {
        if (bit_set(&c->data, c->len, 0)) return nomem(st);
    } else if (offset_set(&c->offsets, c->len + 1, c->data.len)) {
        return nomem(st);
    }
    return finish_slot(st, nd, c, 0);
}

/* ---- numbers into columns ------------------------------------------------------------------------- */

static const double pow10_exact[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The float64 nearest to the number (glibc's strtod is correctly rounded, as Python's float() is).
 * Short mantissas with small exponents are exact products (Clinger's fast path). */
static int to_double(St *st, const Num *x, double *out) {
    size_t nd;
    long long e;
    if (num_parts(st, x, &nd, &e)) return ERR;
    if (nd == 0) {
        *out = x->neg ? -0.0 : 0.0;
        return 0;
    }
    if (nd <= 15 && e >= -22 && e <= 22) {
        uint64_t m = 0;
        for (size_t i = 0; i < nd; i++) m = m * 10 + (uint64_t)(st->num.p[i] - '0');
        double v = (double)m;
        v = e >= 0 ? v * pow10_exact[e] : v / pow10_exact[-e];
        *out = x->neg ? -v : v;
        return 0;
    }
    st->num.len = 0;
    if (buf_put(&st->num, x->s, x->n) || buf_byte(&st->num, 0)) return nomem(st);
    *out = c_locale ? strtod_l((const char *)st->num.p, NULL, c_locale) : strtod((const char *)st->num.p, NULL);
    return 0;
}

static int put_integer(St *st, int ni, const Num *x, int jt) {
    const Node *nd = &st->d->nodes[ni];
    int64_t v;
    if (x->fl == 0 && x->exp == 0 && x->il <= 18) {
        int64_t m = 0;
        for (size_t i = 0; i < x->il; i++) m = m * 10 + (x->ip[i] - '0');
        v = x->neg ? -m : m;
        return put_fixed(st, nd, &st->cols[ni], &v);
    }
    size_t n;
    long long e;
    if (num_parts(st, x, &n, &e)) return ERR;
    if (n == 0) {
        v = 0;
        return put_fixed(st, nd, &st->cols[ni], &v);
    }
    if (e < 0) return invalid(st, P_NOT_WHOLE, ni, jt);
    if ((long long)n + e > 19) return invalid(st, P_OUT_OF_RANGE, ni, jt);
    uint64_t m = 0; /* below 10^19 < 2^64 */
    for (size_t i = 0; i < n; i++) m = m * 10 + (uint64_t)(st->num.p[i] - '0');
    for (long long i = 0; i < e; i++) m *= 10;
    if (x->neg) {
        if (m > (uint64_t)INT64_MAX + 1) return invalid(st, P_OUT_OF_RANGE, ni, jt);
        v = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
    } else {
        if (m > (uint64_t)INT64_MAX) return invalid(st, P_OUT_OF_RANGE, ni, jt);
        v = (int64_t)m;
    }
    return put_fixed(st, nd, &st->cols[ni], &v);
}

/* NUMERIC (decimal128(38, 9)) and BIGNUMERIC (decimal256(76, 38)): the exact value or an error. */
static int put_decimal(St *st, int ni, const Num *x, int jt) {
    const Node *nd = &st->d->nodes[ni];
    int scale = nd->kind == K_NUMERIC ? 9 : 38, whole = nd->kind == K_NUMERIC ? 29 : 38;
    size_t n;
    long long e;
    if (num_parts(st, x, &n, &e)) return ERR;
    if (n > 0 && e < -scale) return invalid(st, P_TOO_PRECISE, ni, jt);
    if (n > 0 && (long long)n + e > whole) return invalid(st, P_OUT_OF_RANGE, ni, jt);
    long long zeros = n > 0 ? e + scale : 0; /* digits x 10^zeros is the unscaled value */
    uint64_t limb[4] = {0, 0, 0, 0};         /* little-endian 256-bit magnitude */
    for (long long i = 0; i < (long long)n + zeros; i++) {
        unsigned __int128 carry = i < (long long)n ? (unsigned)(st->num.p[i] - '0') : 0;
        for (int k = 0; k < 4; k++) {
            unsigned __int128 t = (unsigned __int128)limb[k] * 10 + carry;
            limb[k] = (uint64_t)t;
            carry = t >> 64;
        }
    }
    if (x->neg && n > 0) { /* two's complement */
        unsigned __int128 carry = 1;
        for (int k = 0; k < 4; k++) {
            unsigned __int128 t = (unsigned __int128)(uint64_t)~limb[k] + carry;
            limb[k] = (uint64_t)t;
            carry = t >> 64;
        }
    }
    return put_fixed(st, nd, &st->cols[ni], limb); /* width 16 takes the low two limbs */
}

static int put_epoch_seconds(St *st, int ni, const Num *x, int jt) {
    size_t n;
    long long e;
    if (num_parts(st, x, &n, &e)) return ERR;
    long long kept = n ? (long long)n + e + 6 : 0; /* digits left of the microsecond point (rest dropped) */
    if (kept > 18) return invalid(st, P_TIMESTAMP_RANGE, ni, jt);
    int64_t v = 0;
    for (long long i = 0; i < kept && i < (long long)n; i++) v = v * 10 + (st->num.p[i] - '0');
    for (long long i = n; i < kept; i++) v *= 10;
    if (x->neg) v = -v - (kept < (long long)n); /* digits dropped: towards the past, as for text */
    if (v < TS_MIN || v > TS_MAX) return invalid(st, P_TIMESTAMP_RANGE, ni, jt);
    return put_fixed(st, &st->d->nodes[ni], &st->cols[ni], &v);
}

/* A number in the value of JSON column ni: BigQuery's JSON type holds int64 / uint64 and FLOAT64 and
 * rounds other numbers to FLOAT64, which a number beyond its range cannot be (json_rules.py). Nearly every
 * number has fewer than 309 integer digits, which is all it takes to be below DBL_MAX: no parsing then. */
static int json_number(St *st, int ni, const Num *x) {
    if ((long long)x->il + x->exp <= 308) return 0; /* |x| < 10^(il + exp) <= 10^308 */
    double v;
    if (to_double(st, x, &v)) return ERR;
    return isinf(v) ? invalid(st, P_JSON_NUMBER_RANGE, ni, J_NUMBER) : 0;
}

static int put_number(St *st, int ni, const Num *x, int jt) {
    const Node *nd = &st->d->nodes[ni];
    switch (nd->kind) {
    case K_JSON:
        if (json_number(st, ni, x)) return ERR;
        return put_var(st, nd, &st->cols[ni], x->s, x->n);
    case K_STRING:
        return put_var(st, nd, &st->cols[ni], x->s, x->n);
    case K_INTEGER:
        return put_integer(st, ni, x, jt);
    case K_FLOAT: {
        double v;
        if (to_double(st, x, &v)) return ERR;
        if (isinf(v)) return invalid(st, P_OUT_OF_RANGE, ni, jt);
        return put_fixed(st, nd, &st->cols[ni], &v);
    }
    case K_NUMERIC:
    case K_BIGNUMERIC:
        return put_decimal(st, ni, x, jt);
    case K_TIMESTAMP:
        return put_epoch_seconds(st, ni, x, jt);
    default:
        return invalid(st, P_NO_COERCION, ni, jt);
    }
}

/* ---- dates and times ------------------------------------------------------------------------------ */

static int two(const uint8_t *p, int *v) {
    if (!is_digit(p[0]) || !is_digit(p[1])) return 0;
    *v = (p[0] - '0') * 10 + (p[1] - '0');
    return 1;
}

static int days_in_month(int y, int m) {
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* "YYYY-MM-DD" at s (10 bytes available), years 0001..9999. */
static int parse_date(const uint8_t *s, int64_t *days) {
    int c, y, m, d;
    if (!two(s, &c) || !two(s + 2, &y) || s[4] != '-' || !two(s + 5, &m) || s[7] != '-' || !two(s + 8, &d))
        return 0;
    y += c * 100;
    if (y < 1 || m < 1 || m > 12 || d < 1 || d > days_in_month(y, m)) return 0;
    *days = days_from_civil(y, m, d);
    return 1;
}

/* "HH:MM:SS[.f+]" at the start of [s, s+n): its length (0 if none), seconds of the day and fraction. */
static size_t parse_clock(const uint8_t *s, size_t n, int64_t *secs, const uint8_t **frac, size_t *frac_len) {
    int h, m, sec;
    if (n < 8 || !two(s, &h) || s[2] != ':' || !two(s + 3, &m) || s[5] != ':' || !two(s + 6, &sec)) return 0;
    if (h > 23 || m > 59 || sec > 59) return 0;
    size_t k = 8;
    *frac = NULL;
    *frac_len = 0;
    if (k < n && s[k] == '.') {
        size_t f = k + 1;
        while (f < n && is_digit(s[f])) f++;
        if (f == k + 1) return 0;
        *frac = s + k + 1;
        *frac_len = f - k - 1;
        k = f;
    }
    *secs = h * 3600 + m * 60 + sec;
    return k;
}

static int put_timestamp_text(St *st, int ni, const uint8_t *s, size_t n) {
    int64_t days, secs;
    const uint8_t *frac;
    size_t fl;
    if (n < 19 || !parse_date(s, &days) || !(s[10] == 'T' || s[10] == 't' || s[10] == ' '))
        return invalid(st, P_BAD_TIMESTAMP, ni, J_STRING);
    size_t k = parse_clock(s + 11, n - 11, &secs, &frac, &fl);
    if (!k) return invalid(st, P_BAD_TIMESTAMP, ni, J_STRING);
    const uint8_t *z = s + 11 + k;
    size_t zl = n - 11 - k;
    int64_t offset = 0;
    int spaced = s[10] == ' ';
    if (zl == 0) {
        /* No zone: UTC, after a T as after a space (BigQuery's canonical format reads both so). */
    } else if (zl == 1 && (z[0] == 'Z' || z[0] == 'z')) {
    } else if (zl == 4 && spaced && memcmp(z, " UTC", 4) == 0) {
    } else if ((zl == 6 && z[3] == ':') || zl == 5) {
        int hh, mm;
        if ((z[0] != '+' && z[0] != '-') || !two(z + 1, &hh) || !two(z + zl - 2, &mm) || hh > 23 || mm > 59)
            return invalid(st, P_BAD_TIMESTAMP, ni, J_STRING);
        offset = (hh * 3600 + mm * 60) * (z[0] == '-' ? -1 : 1);
    } else {
        return invalid(st, P_BAD_TIMESTAMP, ni, J_STRING);
    }
    int64_t micros = 0;
    for (size_t i = 0; i < 6; i++) micros = micros * 10 + (i < fl ? frac[i] - '0' : 0);
    int64_t v = (days * 86400 + secs - offset) * 1000000 + micros;
    if (v < TS_MIN || v > TS_MAX) return invalid(st, P_TIMESTAMP_RANGE, ni, J_STRING);
    return put_fixed(st, &st->d->nodes[ni], &st->cols[ni], &v);
}

/* DATETIME and TIME stay text (BigQuery parses them): checked, and cut to microseconds. */
static int put_wall_clock(St *st, int ni, const uint8_t *s, size_t n) {
    const Node *nd = &st->d->nodes[ni];
    int64_t days, secs;
    const uint8_t *frac = NULL;
    size_t fl = 0, k;
    if (nd->kind == K_DATETIME) {
        int ok = n >= 10 && parse_date(s, &days);
        if (ok && n > 10) {
            ok = (s[10] == 'T' || s[10] == ' ') && (k = parse_clock(s + 11, n - 11, &secs, &frac, &fl)) != 0 &&
                 11 + k == n;
        }
        if (!ok) return invalid(st, P_BAD_DATETIME, ni, J_STRING);
    } else if ((k = parse_clock(s, n, &secs, &frac, &fl)) == 0 || k != n) {
        return invalid(st, P_BAD_TIME, ni, J_STRING);
    }
    return put_var(st, nd, &st->cols[ni], s, fl > 6 ? (size_t)(frac - s) + 6 : n);
}

/* ---- strings into columns ------------------------------------------------------------------------- */

static int b64val(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int put_base64(St *st, int ni, const uint8_t *s, size_t n) {
    const Node *nd = &st->d->nodes[ni];
    Col *c = &st->cols[ni];
    size_t pad = n >= 1 && s[n - 1] == '=' ? (n >= 2 && s[n - 2] == '=' ? 2 : 1) : 0;
    if (n % 4) return invalid(st, P_BAD_BASE64, ni, J_STRING);
    if (buf_reserve(&c->data, n / 4 * 3)) return nomem(st);
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            size_t at = i + (size_t)k;
            v[k] = at >= n - pad ? 0 : b64val(s[at]);
            if (v[k] < 0) return invalid(st, P_BAD_BASE64, ni, J_STRING);
        }
        uint32_t w = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) | ((uint32_t)v[2] << 6) | (uint32_t)v[3];
        uint8_t b[3] = {(uint8_t)(w >> 16), (uint8_t)(w >> 8), (uint8_t)w};
        size_t take = i + 4 < n ? 3 : 3 - pad;
        memcpy(c->data.p + c->data.len, b, take);
        c->data.len += take;
    }
    return end_var(st, nd, c);
}

static int ascii_ieq(const uint8_t *s, size_t n, const char *word) {
    size_t k = strlen(word);
    if (n != k) return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c >= 'A' && c <= 'Z') c = (uint8_t)(c + 32);
        if (c != (uint8_t)word[i]) return 0;
    }
    return 1;
}

/* A JSON string's value for leaf column ni. */
static int put_string(St *st, int ni, const uint8_t *s, size_t n) {
    const Node *nd = &st->d->nodes[ni];
    Col *c = &st->cols[ni];
    switch (nd->kind) {
    case K_STRING:
    case K_GEOGRAPHY:
    case K_INTERVAL:
        return put_var(st, nd, c, s, n);
    case K_JSON:
        if (put_json_string(&c->data, s, n)) return nomem(st);
        return end_var(st, nd, c);
    case K_INTEGER:
    case K_FLOAT:
    case K_NUMERIC:
    case K_BIGNUMERIC: {
        if (nd->kind == K_FLOAT) {
            double v;
            int word = 1;
            if (n == 3 && memcmp(s, "NaN", 3) == 0) v = NAN;
            else if (n == 8 && memcmp(s, "Infinity", 8) == 0) v = INFINITY;
            else if (n == 9 && memcmp(s, "-Infinity", 9) == 0) v = -INFINITY;
            else word = 0;
            if (word) return put_fixed(st, nd, c, &v);
        }
        Num x;
        if (n == 0 || scan_number(s, s + n, &x) != n) return invalid(st, P_NOT_A_NUMBER, ni, J_STRING);
        return put_number(st, ni, &x, J_STRING);
    }
    case K_BOOLEAN:
        if (ascii_ieq(s, n, "true")) return put_bool(st, nd, c, 1);
        if (ascii_ieq(s, n, "false")) return put_bool(st, nd, c, 0);
        return invalid(st, P_NOT_BOOLEAN, ni, J_STRING);
    case K_TIMESTAMP:
        return put_timestamp_text(st, ni, s, n);
    case K_DATE: {
        int64_t days;
        if (n != 10 || !parse_date(s, &days)) return invalid(st, P_BAD_DATE, ni, J_STRING);
        int32_t v = (int32_t)days;
        return put_fixed(st, nd, c, &v);
    }
    case K_DATETIME:
    case K_TIME:
        return put_wall_clock(st, ni, s, n);
    case K_BYTES:
        return put_base64(st, ni, s, n);
    default:
        return invalid(st, P_NO_COERCION, ni, J_STRING);
    }
}

/* ---- walking values ------------------------------------------------------------------------------- */

static int enter(St *st) {
    if (++st->depth > st->d->max_depth) return deser(st, st->d->too_deep);
    st->p++;
    skip_ws(st);
    return 0;
}

static int literal(St *st, const char *word, size_t n) {
    if ((size_t)(st->end - st->p) < n || memcmp(st->p, word, n) != 0) return deser(st, "not JSON: not a JSON value");
    st->p += n;
    return 0;
}

/* At '{' or '[': enters it; 1 if members follow, 0 if it is empty (then it is stepped past already). */
static int open_container(St *st, uint8_t close) {
    if (enter(st)) return ERR;
    if (st->p < st->end && *st->p == close) {
        st->p++;
        st->depth--;
        return 0;
    }
    return 1;
}

/* After a member: 1 if another follows (stepped past the ','), 0 at `close` (stepped past, left). */
static int next_member(St *st, uint8_t close) {
    skip_ws(st);
    if (st->p < st->end && *st->p == ',') {
        st->p++;
        skip_ws(st);
        return 1;
    }
    if (st->p < st->end && *st->p == close) {
        st->p++;
        st->depth--;
        return 0;
    }
    return deser(st, close == '}' ? "not JSON: ',' or '}' was expected" : "not JSON: ',' or ']' was expected");
}

/* At an object key: checks it and steps to the value after its ':'. */
static int member_key(St *st, const uint8_t **s, size_t *n, int *escaped) {
    if (st->p >= st->end || *st->p != '"') return deser(st, "not JSON: an object key was expected");
    if (scan_string(st, s, n, escaped)) return ERR;
    skip_ws(st);
    if (st->p >= st->end || *st->p != ':') return deser(st, "not JSON: ':' was expected");
    st->p++;
    skip_ws(st);
    if (st->p >= st->end) return deser(st, "not JSON: a value was expected");
    return 0;
}

/* Writes `"key":` as the next member of a mirror object that has `entries` members so far. */
static int mirror_key(St *st, Buf *mirror, int entries, const uint8_t *ks, size_t kn, int kesc) {
    if ((entries && buf_byte(mirror, ',')) || put_raw_string(st, mirror, ks, kn, kesc) || buf_byte(mirror, ':'))
        return nomem(st);
    return 0;
}

/* Checks the value at st->p and steps past it; with `out`, also writes it as compact JSON. With a
 * `json_node` (else -1) it is that JSON column's value, whose numbers BigQuery must be able to hold. */
static int walk_value(St *st, Buf *out, int json_node) {
    if (st->p >= st->end) return deser(st, "not JSON: a value was expected");
    uint8_t c = *st->p;
    const uint8_t *s;
    size_t n;
    int esc;
    if (c == '{' || c == '[') {
        uint8_t close = c == '{' ? '}' : ']';
        int more = open_container(st, close);
        if (more < 0) return ERR;
        if (out && buf_byte(out, c)) return nomem(st);
        while (more) {
            if (c == '{') {
                if (member_key(st, &s, &n, &esc)) return ERR;
                if (out && (put_raw_string(st, out, s, n, esc) || buf_byte(out, ':'))) return nomem(st);
            }
            if (walk_value(st, out, json_node) || (more = next_member(st, close)) < 0) return ERR;
            if (more && out && buf_byte(out, ',')) return nomem(st);
        }
        return out && buf_byte(out, close) ? nomem(st) : 0;
    }
    if (c == '"') {
        if (scan_string(st, &s, &n, &esc)) return ERR;
        return out && put_raw_string(st, out, s, n, esc) ? nomem(st) : 0;
    }
    if (c == 't' || c == 'f' || c == 'n') {
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        size_t k = strlen(word);
        if (literal(st, word, k)) return ERR;
        return out && buf_put(out, word, k) ? nomem(st) : 0;
    }
    Num x;
    if (!scan_number(st->p, st->end, &x)) return deser(st, "not JSON: not a JSON value");
    st->p += x.n;
    if (json_node >= 0 && json_number(st, json_node, &x)) return ERR;
    return out && buf_put(out, x.s, x.n) ? nomem(st) : 0;
}

static int field_value(St *st, int ni, Buf *mirror);

/* A non-null value for leaf column ni. */
static int put_scalar(St *st, int ni) {
    const Node *nd = &st->d->nodes[ni];
    Col *c = &st->cols[ni];
    uint8_t ch = *st->p;
    int k = nd->kind;
    if (ch == '"') {
        const uint8_t *s;
        size_t n;
        int esc;
        if (scan_string(st, &s, &n, &esc)) return ERR;
        if (k == K_STRING || k == K_GEOGRAPHY || k == K_INTERVAL) {
            if (esc ? unescape(&c->data, s, n) : buf_put(&c->data, s, n)) return nomem(st);
            return end_var(st, nd, c);
        }
        if (k == K_JSON) {
            if (put_raw_string(st, &c->data, s, n, esc)) return nomem(st);
            return end_var(st, nd, c);
        }
        return decoded(st, s, n, esc, &s, &n) ? ERR : put_string(st, ni, s, n);
    }
    if (ch == 't' || ch == 'f') {
        int v = ch == 't';
        if (literal(st, v ? "true" : "false", v ? 4 : 5)) return ERR;
        if (k == K_BOOLEAN) return put_bool(st, nd, c, v);
        if (k == K_STRING || k == K_JSON) return put_var(st, nd, c, v ? "true" : "false", v ? 4 : 5);
        return invalid(st, P_NO_COERCION, ni, J_BOOLEAN);
    }
    if (ch == '{' || ch == '[') {
        if (k == K_STRING || k == K_JSON || (k == K_GEOGRAPHY && ch == '{')) {
            if (walk_value(st, &c->data, k == K_JSON ? ni : -1)) return ERR;
            return end_var(st, nd, c);
        }
        return invalid(st, P_NO_COERCION, ni, json_type_of(ch));
    }
    Num x;
    if (!scan_number(st->p, st->end, &x)) return deser(st, "not JSON: not a JSON value");
    st->p += x.n;
    return put_number(st, ni, &x, J_NUMBER);
}

/* Renames and folds a decoded key into st->key (json_rules.column_key) and finds its column among ni's
 * children: -1 if there is none. */
static int lookup(St *st, int ni, const uint8_t *s, size_t n) {
    const Node *nd = &st->d->nodes[ni];
    Buf *k = &st->key;
    k->len = 0;
    if (buf_reserve(k, n + 1)) return nomem(st), -2;
    if (n && is_digit(s[0])) k->p[k->len++] = '_';
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < k->len; i++) h = (h ^ k->p[i]) * 16777619u;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c == '-' || c == '.') c = '_';
        else if (c >= 'A' && c <= 'Z') c = (uint8_t)(c + 32);
        k->p[k->len++] = c;
        h = (h ^ c) * 16777619u;
    }
    if (!nd->table) return -1;
    for (uint32_t slot = h & nd->mask;; slot = (slot + 1) & nd->mask) {
        int child = nd->table[slot];
        if (child < 0) return -1;
        const Node *cn = &st->d->nodes[child];
        if ((size_t)cn->folded_len == k->len && memcmp(cn->folded, k->p, k->len) == 0) return child;
    }
}

/* The value of column ni; with a mirror, its unknown values as the mirror's next member `"key":...`,
 * taken back if there were none. */
static int mirrored_value(St *st, int ni, Buf *mirror, int *entries, const uint8_t *ks, size_t kn, int kesc) {
    if (!mirror) return field_value(st, ni, NULL) < 0 ? ERR : 0;
    size_t mark = mirror->len;
    if (mirror_key(st, mirror, *entries, ks, kn, kesc)) return ERR;
    int wrote = field_value(st, ni, mirror);
    if (wrote < 0) return ERR;
    if (wrote) (*entries)++;
    else mirror->len = mark;
    return 0;
}

/* At '{' of an object for record column ni: one slot for each child (its value, or what it takes when
 * missing). Unknown keys go to `mirror` when it is given. Returns 1 if it wrote to the mirror. */
static int record_object(St *st, int ni, Buf *mirror) {
    const Node *nd = &st->d->nodes[ni];
    size_t start = st->cols[ni].len; /* this object's slot among ni's */
    int entries = 0;
    int more = open_container(st, '}');
    while (more > 0) {
        const uint8_t *ks, *s;
        size_t kn, n;
        int kesc;
        if (member_key(st, &ks, &kn, &kesc)) return ERR;
        if (decoded(st, ks, kn, kesc, &s, &n)) return ERR;
        int child = lookup(st, ni, s, n);
        if (child == -2) return ERR;
        if (child < 0 || child == st->d->ap_node) {
            st->unknown = 1;
            if (mirror && mirror_key(st, mirror, entries++, ks, kn, kesc)) return ERR;
            if (walk_value(st, mirror, -1)) return ERR;
        } else {
            const Node *cn = &st->d->nodes[child];
            Col *cc = &st->cols[child];
            push(st, child, -1);
            if (slots(cn, cc) > start) {
                st->dup_key = cc->key;
                st->dup_len = cc->key_len;
                st->dup_escaped = cc->key_escaped;
                st->dup_key2 = ks;
                st->dup_len2 = kn;
                st->dup_escaped2 = kesc;
                return invalid(st, P_DUPLICATE_KEY, child, json_type_of(*st->p));
            }
            cc->key = ks;
            cc->key_len = kn;
            cc->key_escaped = kesc;
            if (mirrored_value(st, child, cn->kind == K_RECORD ? mirror : NULL, &entries, ks, kn, kesc)) return ERR;
            pop(st);
        }
        more = next_member(st, '}');
    }
    if (more < 0) return ERR;
    for (int k = 0; k < nd->nchildren; k++) {
        int child = nd->children[k];
        if (child == st->d->ap_node || slots(&st->d->nodes[child], &st->cols[child]) > start) continue;
        if (st->d->nodes[child].mode == M_REQUIRED) {
            push(st, child, -1);
            return invalid(st, P_REQUIRED_MISSING, child, J_NULL);
        }
        if (put_absent(st, child)) return ERR;
    }
    return entries > 0;
}

/* One element (or the value of a non-REPEATED column), not null. Records write their mirror object
 * (even an empty one: arrays mirror element by element). */
static int element_value(St *st, int ni, Buf *mirror) {
    const Node *nd = &st->d->nodes[ni];
    if (nd->kind != K_RECORD) return put_scalar(st, ni) < 0 ? ERR : 0;
    if (*st->p != '{') return invalid(st, P_NO_COERCION, ni, json_type_of(*st->p));
    if (mirror && buf_byte(mirror, '{')) return nomem(st);
    int wrote = record_object(st, ni, mirror);
    if (wrote < 0) return ERR;
    if (mirror && buf_byte(mirror, '}')) return nomem(st);
    if (finish_slot(st, nd, &st->cols[ni], 1)) return ERR;
    return wrote;
}

static int array_value(St *st, int ni, Buf *mirror) {
    int any = 0;
    if (st->d->nodes[ni].kind != K_RECORD) mirror = NULL;
    int more = open_container(st, ']');
    if (more < 0) return ERR;
    if (mirror && buf_byte(mirror, '[')) return nomem(st);
    for (Py_ssize_t i = 0; more > 0; i++) {
        push(st, ni, i);
        if (*st->p == 'n') {
            if (literal(st, "null", 4)) return ERR;
            return invalid(st, P_NULL_ELEMENT, ni, J_NULL);
        }
        if (mirror && i && buf_byte(mirror, ',')) return nomem(st);
        int wrote = element_value(st, ni, mirror);
        if (wrote < 0) return ERR;
        any |= wrote;
        pop(st);
        more = next_member(st, ']');
    }
    if (more < 0) return ERR;
    if (mirror && buf_byte(mirror, ']')) return nomem(st);
    if (end_list(st, &st->cols[ni])) return ERR;
    return any;
}

/* An object for a map column (REPEATED RECORD of key, value): one {key, value} item per entry. */
static int map_value(St *st, int ni, Buf *mirror) {
    const Node *nd = &st->d->nodes[ni];
    int kn_ = nd->map_key, vn = nd->map_value, entries = 0;
    if (st->d->nodes[vn].kind != K_RECORD) mirror = NULL;
    int more = open_container(st, '}');
    if (more < 0) return ERR;
    if (mirror && buf_byte(mirror, '{')) return nomem(st);
    for (Py_ssize_t i = 0; more > 0; i++) {
        const uint8_t *ks, *s;
        size_t kn, n;
        int kesc;
        if (member_key(st, &ks, &kn, &kesc)) return ERR;
        if (decoded(st, ks, kn, kesc, &s, &n)) return ERR;
        push(st, ni, i);
        push(st, kn_, -1);
        if (put_string(st, kn_, s, n)) return ERR;
        pop(st);
        push(st, vn, -1);
        if (mirrored_value(st, vn, mirror, &entries, ks, kn, kesc)) return ERR;
        pop(st);
        pop(st);
        if (finish_slot(st, nd, &st->cols[ni], 1)) return ERR;
        more = next_member(st, '}');
    }
    if (more < 0) return ERR;
    if (mirror && buf_byte(mirror, '}')) return nomem(st);
    if (end_list(st, &st->cols[ni])) return ERR;
    return entries > 0;
}

/* The value at st->p for column ni (the path already names ni): exactly one slot of ni. */
static int field_value(St *st, int ni, Buf *mirror) {
    const Node *nd = &st->d->nodes[ni];
    uint8_t ch = *st->p;
    if (nd->mode == M_REPEATED) {
        if (ch == 'n') {
            if (literal(st, "null", 4)) return ERR;
            return end_list(st, &st->cols[ni]) ? ERR : 0;
        }
        if (ch == '[') return array_value(st, ni, mirror);
        if (ch == '{' && nd->map_key >= 0) return map_value(st, ni, mirror);
        return invalid(st, P_NOT_AN_ARRAY, ni, json_type_of(ch));
    }
    if (ch == 'n') {
        if (nd->mode == M_REQUIRED) return invalid(st, P_REQUIRED_MISSING, ni, J_NULL);
        if (literal(st, "null", 4)) return ERR;
        return put_absent(st, ni) ? ERR : 0;
    }
    return element_value(st, ni, mirror);
}

/* ---- one document --------------------------------------------------------------------------------- */

static void snapshot(St *st) {
    for (int i = 0; i < st->d->nnodes; i++) {
        Col *c = &st->cols[i];
        st->snaps[i] = (Snap){c->len, c->nulls, c->data.len, c->list_len};
    }
}

static void restore(St *st) {
    for (int i = 0; i < st->d->nnodes; i++) {
        Col *c = &st->cols[i];
        Snap *s = &st->snaps[i];
        c->len = s->len;
        c->nulls = s->nulls;
        c->data.len = s->data_len;
        c->list_len = s->list_len;
    }
}

static int document(St *st) {
    const Decoder *d = st->d;
    Buf *mirror = d->ap_node >= 0 ? &st->mirror : NULL;
    skip_ws(st);
    if (st->p >= st->end || *st->p != '{') return deser(st, "not a JSON object at the top");
    if (mirror) {
        mirror->len = 0;
        if (buf_byte(mirror, '{')) return nomem(st);
    }
    int wrote = record_object(st, 0, mirror);
    if (wrote < 0) return ERR;
    skip_ws(st);
    if (st->p != st->end) return deser(st, "not JSON: data after the object");
    if (mirror) {
        const Node *ap = &d->nodes[d->ap_node];
        if (wrote) {
            if (buf_byte(mirror, '}')) return nomem(st);
            if (put_var(st, ap, &st->cols[d->ap_node], mirror->p, mirror->len)) return ERR;
        } else if (put_absent(st, d->ap_node)) {
            return ERR;
        }
    }
    return finish_slot(st, &d->nodes[0], &st->cols[0], 1);
}

/* Texts of a failure, into the arena (spans, as the arena may move). */
static int arena_put(St *st, const uint8_t *s, size_t n, int escaped, size_t *at, size_t *len) {
    *at = st->arena.len;
    if (escaped ? unescape(&st->arena, s, n) : buf_put(&st->arena, s, n)) return ERR;
    *len = st->arena.len - *at;
    return 0;
}

static int record_failure(St *st, Py_ssize_t row) {
    if (st->nfails == st->capfails) {
        size_t cap = st->capfails ? st->capfails * 2 : 16;
        Failure *f = realloc(st->fails, cap * sizeof(Failure));
        if (!f) return ERR;
        st->fails = f;
        st->capfails = cap;
    }
    Failure *f = &st->fails[st->nfails++];
    memset(f, 0, sizeof *f);
    f->row = row;
    f->failure = st->failure;
    if (st->failure == F_DESER) {
        f->reason = st->reason;
        f->at = st->at;
        return 0;
    }
    f->problem = st->problem;
    f->node = st->err_node;
    f->json_type = st->err_json;
    f->path = st->arena.len;
    for (int i = 0; i < st->path_len; i++) {
        const Step *step = &st->path[i];
        if (step->index >= 0) {
            char text[32];
            int k = snprintf(text, sizeof text, "[%zd]", step->index);
            if (buf_put(&st->arena, text, (size_t)k)) return ERR;
        } else {
            const Node *nd = &st->d->nodes[step->node];
            if ((i && buf_byte(&st->arena, '.')) || buf_put(&st->arena, nd->name, (size_t)nd->name_len))
                return ERR;
        }
    }
    f->path_len = st->arena.len - f->path;
    if (st->problem == P_DUPLICATE_KEY) {
        if (arena_put(st, st->dup_key, st->dup_len, st->dup_escaped, &f->key1, &f->key1_len) ||
            arena_put(st, st->dup_key2, st->dup_len2, st->dup_escaped2, &f->key2, &f->key2_len))
            return ERR;
    }
    return 0;
}

/* The whole batch: returns F_NONE, or F_NOMEM / F_TOO_BIG when it cannot be done at all. */
static int decode_all(St *st, const uint8_t *validity, const void *offsets, int large, const uint8_t *data,
                      Py_ssize_t offset, Py_ssize_t length) {
    for (Py_ssize_t i = 0; i < length; i++) {
        Py_ssize_t at = offset + i;
        if (validity && !(validity[at >> 3] & (1u << (at & 7)))) {
            if (put_absent(st, 0)) return st->failure;
            continue;
        }
        int64_t lo = large ? ((const int64_t *)offsets)[at] : ((const int32_t *)offsets)[at];
        int64_t hi = large ? ((const int64_t *)offsets)[at + 1] : ((const int32_t *)offsets)[at + 1];
        snapshot(st);
        st->start = st->p = data + lo;
        st->end = data + hi;
        st->depth = 0;
        st->path_len = 0;
        st->unknown = 0;
        st->failure = F_NONE;
        if (document(st) == 0) {
            if (st->unknown && st->d->ap_node < 0) {
                int64_t row = i;
                if (buf_put(&st->unknown_rows, &row, sizeof row)) return F_NOMEM;
            }
            continue;
        }
        if (st->failure == F_NOMEM || st->failure == F_TOO_BIG) return st->failure;
        if (st->failure == F_INVALID) { /* is it JSON at all? */
            const uint8_t *p = st->p;
            st->p = st->start;
            st->depth = 0;
            skip_ws(st);
            if (walk_value(st, NULL, -1) == 0) {
                skip_ws(st);
                if (st->p != st->end) deser(st, "not JSON: data after the object");
            }
            if (st->failure == F_NOMEM) return F_NOMEM;
            if (st->failure == F_INVALID) st->p = p;
        }
        restore(st);
        if (record_failure(st, i) || put_absent(st, 0)) return F_NOMEM;
    }
    return F_NONE;
}

/* ---- Python: buffers ------------------------------------------------------------------------------ */

/* A malloc'ed buffer handed to pyarrow without a copy (it exposes the buffer protocol). */
typedef struct {
    PyObject_HEAD
    uint8_t *p;
    Py_ssize_t n;
} OwnedBuffer;

static int owned_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    OwnedBuffer *b = (OwnedBuffer *)self;
    return PyBuffer_FillInfo(view, self, b->p, b->n, 1, flags);
}

static void owned_dealloc(PyObject *self) {
    free(((OwnedBuffer *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs owned_as_buffer = {owned_getbuffer, NULL};

static PyTypeObject OwnedBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "firehose_bq.decode._json.OwnedBuffer",
    .tp_basicsize = sizeof(OwnedBuffer),
    .tp_dealloc = owned_dealloc,
    .tp_as_buffer = &owned_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

/* Takes b's memory (b is left empty); `size` bytes of it are the buffer. */
static PyObject *hand_over(Buf *b, size_t size) {
    if (buf_cover(b, size ? size : 1)) return PyErr_NoMemory();
    OwnedBuffer *o = PyObject_New(OwnedBuffer, &OwnedBufferType);
    if (!o) return NULL;
    o->p = b->p;
    o->n = (Py_ssize_t)size;
    *b = (Buf){NULL, 0, 0};
    return (PyObject *)o;
}

/* (length, null_count, validity, data, offsets, list_length, list_offsets) of one column. */
static PyObject *column_tuple(const Node *nd, Col *c) {
    PyObject *validity = Py_None, *data = Py_None, *offsets = Py_None, *list_offsets = Py_None;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    PyObject *t = NULL;
    if (nd->mode == M_NULLABLE && c->nulls) {
        Py_DECREF(validity);
        if (!(validity = hand_over(&c->validity, (c->len + 7) / 8))) goto done;
    }
    if (nd->kind != K_RECORD) {
        size_t size = nd->width > 0 ? c->len * (size_t)nd->width : nd->width < 0 ? (c->len + 7) / 8 : c->data.len;
        Py_DECREF(data);
        if (!(data = hand_over(&c->data, size))) goto done;
        if (nd->width == 0) {
            Py_DECREF(offsets);
            if (!(offsets = hand_over(&c->offsets, (c->len + 1) * 4))) goto done;
        }
    }
    if (nd->mode == M_REPEATED) {
        Py_DECREF(list_offsets);
        if (!(list_offsets = hand_over(&c->list_offsets, (c->list_len + 1) * 4))) goto done;
    }
    t = Py_BuildValue("(nnOOOnO)", (Py_ssize_t)c->len, (Py_ssize_t)c->nulls, validity, data, offsets,
                      (Py_ssize_t)c->list_len, list_offsets);
done:
    Py_XDECREF(validity);
    Py_XDECREF(data);
    Py_XDECREF(offsets);
    Py_XDECREF(list_offsets);
    return t;
}

static PyObject *failure_tuple(St *st, const Failure *f) {
    const char *a = (const char *)st->arena.p;
    if (f->failure == F_DESER)
        return Py_BuildValue("(nisn)", f->row, F_DESER, f->reason, (Py_ssize_t)f->at);
    return Py_BuildValue("(niiiis#s#s#)", f->row, F_INVALID, f->problem, f->node, f->json_type, a + f->path,
                         (Py_ssize_t)f->path_len, a + f->key1, (Py_ssize_t)f->key1_len, a + f->key2,
                         (Py_ssize_t)f->key2_len);
}

static void free_state(St *st, int nnodes) {
    if (st->cols) {
        for (int i = 0; i < nnodes; i++) {
            Col *c = &st->cols[i];
            free(c->validity.p);
            free(c->data.p);
            free(c->offsets.p);
            free(c->list_offsets.p);
        }
    }
    free(st->cols);
    free(st->snaps);
    free(st->path);
    free(st->mirror.p);
    free(st->str.p);
    free(st->key.p);
    free(st->num.p);
    free(st->arena.p);
    free(st->fails);
    free(st->unknown_rows.p);
}

/* decode(validity | None, offsets, data, offset, length, large) -> (columns, failures, unknown_rows) */
static PyObject *Decoder_decode(Decoder *self, PyObject *args) {
    PyObject *vobj, *oobj, *dobj;
    Py_ssize_t offset, length;
    int large;
    if (!PyArg_ParseTuple(args, "OOOnnp", &vobj, &oobj, &dobj, &offset, &length, &large)) return NULL;
    Py_buffer vb = {0}, ob = {0}, db = {0};
    int have_v = 0, have_o = 0, have_d = 0;
    PyObject *result = NULL;
    St st;
    memset(&st, 0, sizeof st);
    if (vobj != Py_None) {
        if (PyObject_GetBuffer(vobj, &vb, PyBUF_SIMPLE)) goto done;
        have_v = 1;
    }
    if (PyObject_GetBuffer(oobj, &ob, PyBUF_SIMPLE)) goto done;
    have_o = 1;
    if (PyObject_GetBuffer(dobj, &db, PyBUF_SIMPLE)) goto done;
    have_d = 1;
    size_t width = large ? 8 : 4;
    if (offset < 0 || length < 0 || (size_t)ob.len < (size_t)(offset + length + 1) * width ||
        (have_v && (size_t)vb.len * 8 < (size_t)(offset + length))) {
        PyErr_SetString(PyExc_ValueError, "buffers do not match the array's length");
        goto done;
    }
    {
        const uint8_t *offs = ob.buf;
        int64_t first = large ? ((const int64_t *)offs)[offset] : ((const int32_t *)offs)[offset];
        int64_t last = large ? ((const int64_t *)offs)[offset + length] : ((const int32_t *)offs)[offset + length];
        if (first < 0 || last < first || (size_t)last > (size_t)db.len) {
            PyErr_SetString(PyExc_ValueError, "offsets point outside the data buffer");
            goto done;
        }
        for (Py_ssize_t i = offset; i < offset + length; i++) {
            int64_t a = large ? ((const int64_t *)offs)[i] : ((const int32_t *)offs)[i];
            int64_t b = large ? ((const int64_t *)offs)[i + 1] : ((const int32_t *)offs)[i + 1];
            if (b < a) {
                PyErr_SetString(PyExc_ValueError, "offsets are not increasing");
                goto done;
            }
        }
    }
    st.d = self;
    if (buf_reserve(&st.arena, 64)) {
        PyErr_NoMemory();
        goto done;
    }
    st.cols = calloc((size_t)self->nnodes, sizeof(Col));
    st.snaps = calloc((size_t)self->nnodes, sizeof(Snap));
    st.path = calloc((size_t)self->max_path, sizeof(Step));
    if (!st.cols || !st.snaps || !st.path) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < self->nnodes; i++) {
        const Node *nd = &self->nodes[i];
        if ((nd->width == 0 && nd->kind != K_RECORD && offset_set(&st.cols[i].offsets, 0, 0)) ||
            (nd->mode == M_REPEATED && offset_set(&st.cols[i].list_offsets, 0, 0))) {
            PyErr_NoMemory();
            goto done;
        }
    }
    int outcome;
    Py_BEGIN_ALLOW_THREADS
    outcome = decode_all(&st, have_v ? vb.buf : NULL, ob.buf, large, db.buf, offset, length);
    Py_END_ALLOW_THREADS
    if (outcome == F_NOMEM) {
        PyErr_NoMemory();
        goto done;
    }
    if (outcome == F_TOO_BIG) {
        PyErr_SetString(PyExc_OverflowError, "a column of this batch holds more than 2 GiB; decode smaller batches");
        goto done;
    }
    {
        PyObject *columns = PyList_New(self->nnodes), *failures = PyList_New((Py_ssize_t)st.nfails);
        PyObject *unknown = PyList_New((Py_ssize_t)(st.unknown_rows.len / sizeof(int64_t)));
        if (!columns || !failures || !unknown) goto fail_lists;
        for (int i = 0; i < self->nnodes; i++) {
            PyObject *t = column_tuple(&self->nodes[i], &st.cols[i]);
            if (!t) goto fail_lists;
            PyList_SET_ITEM(columns, i, t);
        }
        for (size_t i = 0; i < st.nfails; i++) {
            PyObject *t = failure_tuple(&st, &st.fails[i]);
            if (!t) goto fail_lists;
            PyList_SET_ITEM(failures, (Py_ssize_t)i, t);
        }
        for (size_t i = 0; i < st.unknown_rows.len / sizeof(int64_t); i++) {
            int64_t row;
            memcpy(&row, st.unknown_rows.p + i * sizeof row, sizeof row);
            PyObject *r = PyLong_FromLongLong(row);
            if (!r) goto fail_lists;
            PyList_SET_ITEM(unknown, (Py_ssize_t)i, r);
        }
        result = Py_BuildValue("(NNN)", columns, failures, unknown);
        goto done;
    fail_lists:
        Py_XDECREF(columns);
        Py_XDECREF(failures);
        Py_XDECREF(unknown);
    }
done:
    free_state(&st, self->nnodes);
    if (have_v) PyBuffer_Release(&vb);
    if (have_o) PyBuffer_Release(&ob);
    if (have_d) PyBuffer_Release(&db);
    return result;
}

/* ---- Python: the decoder -------------------------------------------------------------------------- */

static const int kind_width[K_COUNT] = {
    [K_RECORD] = 0, [K_STRING] = 0, [K_BYTES] = 0,     [K_INTEGER] = 8,    [K_FLOAT] = 8,
    [K_BOOLEAN] = -1, [K_TIMESTAMP] = 8, [K_DATE] = 4, [K_NUMERIC] = 16, [K_BIGNUMERIC] = 32,
    [K_DATETIME] = 0, [K_TIME] = 0, [K_JSON] = 0,      [K_GEOGRAPHY] = 0, [K_INTERVAL] = 0,
};

static void Decoder_dealloc(Decoder *self) {
    if (self->nodes) {
        for (int i = 0; i < self->nnodes; i++) {
            free(self->nodes[i].children);
            free(self->nodes[i].table);
            free(self->nodes[i].name);
            free(self->nodes[i].folded);
        }
        free(self->nodes);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static char *copy_bytes(const char *s, Py_ssize_t n) {
    char *p = malloc((size_t)n + 1);
    if (p) {
        memcpy(p, s, (size_t)n);
        p[n] = 0;
    }
    return p;
}

static int schema_depth(const Decoder *d, int ni) {
    int deepest = 0;
    for (int k = 0; k < d->nodes[ni].nchildren; k++) {
        int depth = schema_depth(d, d->nodes[ni].children[k]);
        if (depth > deepest) deepest = depth;
    }
    return deepest + 1;
}

/* Decoder(nodes, ap_node, max_depth); nodes: (kind, mode, name, folded name, children, map_key, map_value)
 * in depth-first order, the row first (json_rules.Plan.nodes). */
static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwds) {
    PyObject *specs;
    int ap_node, max_depth;
    if (!PyArg_ParseTuple(args, "O!ii", &PyList_Type, &specs, &ap_node, &max_depth)) return -1;
    if (self->nodes) {
        PyErr_SetString(PyExc_RuntimeError, "a Decoder is initialised once");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(specs);
    if (n < 1 || n > 1000000 || ap_node >= n || max_depth < 1) {
        PyErr_SetString(PyExc_ValueError, "bad column table");
        return -1;
    }
    self->nodes = calloc((size_t)n, sizeof(Node));
    if (!self->nodes) {
        PyErr_NoMemory();
        return -1;
    }
    self->nnodes = (int)n;
    self->ap_node = ap_node;
    self->max_depth = max_depth;
    snprintf(self->too_deep, sizeof self->too_deep, "not JSON this decoder reads: nested deeper than %d levels",
             max_depth);
    for (Py_ssize_t i = 0; i < n; i++) {
        Node *nd = &self->nodes[i];
        int kind, mode, map_key, map_value;
        const char *name, *folded;
        Py_ssize_t name_len, folded_len;
        PyObject *children;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(specs, i), "iis#y#O!ii", &kind, &mode, &name, &name_len, &folded,
                              &folded_len, &PyTuple_Type, &children, &map_key, &map_value))
            return -1;
        if (kind < 0 || kind >= K_COUNT || mode < M_NULLABLE || mode > M_REPEATED || map_key >= n || map_value >= n) {
            PyErr_SetString(PyExc_ValueError, "bad column table");
            return -1;
        }
        nd->kind = kind;
        nd->mode = mode;
        nd->width = kind_width[kind];
        nd->map_key = map_key;
        nd->map_value = map_value;
        nd->name = copy_bytes(name, name_len);
        nd->name_len = name_len;
        nd->folded = copy_bytes(folded, folded_len);
        nd->folded_len = folded_len;
        nd->nchildren = (int)PyTuple_GET_SIZE(children);
        nd->children = calloc((size_t)nd->nchildren + 1, sizeof(int));
        if (!nd->name || !nd->folded || !nd->children) {
            PyErr_NoMemory();
            return -1;
        }
        for (int k = 0; k < nd->nchildren; k++) {
            long child = PyLong_AsLong(PyTuple_GET_ITEM(children, k));
            if (child <= i || child >= n) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad column table");
                return -1;
            }
            nd->children[k] = (int)child;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* children's hash tables, at most half full */
        Node *nd = &self->nodes[i];
        if (!nd->nchildren) continue;
        uint32_t size = 4;
        while (size < (uint32_t)nd->nchildren * 2) size *= 2;
        nd->mask = size - 1;
        nd->table = malloc(size * sizeof(int));
        if (!nd->table) {
            PyErr_NoMemory();
            return -1;
        }
        for (uint32_t s = 0; s < size; s++) nd->table[s] = -1;
        for (int k = 0; k < nd->nchildren; k++) {
            const Node *cn = &self->nodes[nd->children[k]];
            uint32_t h = 2166136261u;
            for (Py_ssize_t j = 0; j < cn->folded_len; j++) h = (h ^ (uint8_t)cn->folded[j]) * 16777619u;
            uint32_t slot = h & nd->mask;
            while (nd->table[slot] >= 0) slot = (slot + 1) & nd->mask;
            nd->table[slot] = nd->children[k];
        }
    }
    self->max_path = 2 * schema_depth(self, 0) + 2;
    return 0;
}

static PyMethodDef Decoder_methods[] = {
    {"decode", (PyCFunction)Decoder_decode, METH_VARARGS,
     "decode(validity, offsets, data, offset, length, large) -> (columns, failures, unknown_rows)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "firehose_bq.decode._json.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "JSON documents -> Arrow buffers of one table's columns",
    .tp_methods = Decoder_methods,
    .tp_init = (initproc)Decoder_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_json",
    .m_doc = "Native JSON input decoder (see json_native.py).",
    .m_size = -1,
};

static int add_table(PyObject *m, const char *name, const char *const *names, int first, int count) {
    PyObject *d = PyDict_New();
    if (!d) return -1;
    for (int i = 0; i < count; i++) {
        PyObject *v = PyLong_FromLong(first + i);
        if (!v || PyDict_SetItemString(d, names[i], v)) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return -1;
        }
        Py_DECREF(v);
    }
    if (PyModule_AddObject(m, name, d)) {
        Py_DECREF(d);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__json(void) {
    static const char *const kinds[] = {"RECORD", "STRING", "BYTES", "INTEGER", "FLOAT", "BOOLEAN", "TIMESTAMP",
                                        "DATE", "NUMERIC", "BIGNUMERIC", "DATETIME", "TIME", "JSON", "GEOGRAPHY",
                                        "INTERVAL"};
    static const char *const modes[] = {"NULLABLE", "REQUIRED", "REPEATED"};
    static const char *const problems[] = {"NO_COERCION", "NOT_AN_ARRAY", "REQUIRED_MISSING", "NULL_ELEMENT",
                                           "DUPLICATE_KEY", "NOT_A_NUMBER", "NOT_WHOLE", "OUT_OF_RANGE",
                                           "TOO_PRECISE", "NOT_BOOLEAN", "BAD_TIMESTAMP", "TIMESTAMP_RANGE",
                                           "BAD_DATE", "BAD_DATETIME", "BAD_TIME", "BAD_BASE64",
                                           "JSON_NUMBER_RANGE"};
    static const char *const json_types[] = {"null", "boolean", "number", "string", "array", "object"};
    for (int c = 0; c < 256; c++) plain_byte[c] = c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (PyType_Ready(&DecoderType) < 0 || PyType_Ready(&OwnedBufferType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) ||
        add_table(m, "KINDS", kinds, 0, K_COUNT) || add_table(m, "MODES", modes, 0, 3) ||
        add_table(m, "PROBLEMS", problems, 1, P_JSON_NUMBER_RANGE) || add_table(m, "JSON_TYPES", json_types, 0, 6) ||
        PyModule_AddIntConstant(m, "DESERIALIZATION", F_DESER)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
