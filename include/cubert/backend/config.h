/* cubert — configuration keys (for backend authors and cubert itself).
 *
 * Every setting is one key, described once by a cube_config_key: its name
 * (the file key; the variable is CUBERT_ and the name in upper case), the
 * values it accepts, its default and one line of documentation. The core
 * lists its own keys; a backend lists its keys in cube_backend.config_keys.
 * From these descriptors cubert reads the environment and the
 * configuration file, warns about values a key does not accept, lists the
 * configuration in `cubert info`, and its tests check that
 * docs/configuration.md documents exactly these keys.
 *
 * A variable that is set and usable wins over the file. The file is read
 * once per process; lookups read the environment each time, so a backend
 * sees the variables as they are when it opens.
 *
 * Ownership: every string these functions hand out is borrowed (the
 * descriptors and the file's values live as long as the process, a
 * variable's value until the environment changes); the caller frees
 * nothing. None of them fails with an error: a key that does not exist is
 * the -1 or NULL each function states.
 *
 * Thread safety: every function may be called from any thread, as long as
 * no thread changes the environment meanwhile (the getenv rule).
 */
#ifndef CUBERT_BACKEND_CONFIG_H
#define CUBERT_BACKEND_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The longest value a key may accept, in bytes. */
#define CUBE_CONFIG_TEXT_MAX 4096

typedef enum cube_config_type {
    CUBE_CONFIG_TEXT, /* any text of at most max_len bytes */
    CUBE_CONFIG_PATH, /* a file or directory, at most max_len bytes */
    CUBE_CONFIG_UINT, /* a decimal number in min..max: digits only */
    CUBE_CONFIG_WORD  /* one of words, case ignored */
} cube_config_type;

/* One word a CUBE_CONFIG_WORD key accepts, and the number it stands for.
 * An alias is accepted but left out of messages and listings. */
typedef struct cube_config_word {
    const char *word;
    int value;
    int alias;
} cube_config_word;

enum {
    /* An empty value is a value (cache_dir: the disk cache off); without
     * this flag an empty value counts as unset. */
    CUBE_CONFIG_EMPTY_IS_VALUE = 1u << 0,
    /* Only the environment sets it: the file has no such key. */
    CUBE_CONFIG_ENV_ONLY = 1u << 1
};

/* A key. Tables of keys end with an entry whose name is NULL. */
typedef struct cube_config_key {
    /* Lower case letters, digits and '_', unique among all keys: the file
     * key, and CUBERT_<NAME> the variable. A backend's keys should name it
     * ("cpu_cc"). */
    const char *name;
    cube_config_type type;
    unsigned flags;                /* CUBE_CONFIG_* flags above */
    uint32_t min, max;             /* CUBE_CONFIG_UINT: the accepted range */
    const cube_config_word *words; /* CUBE_CONFIG_WORD: ends with NULL */
    size_t max_len; /* TEXT, PATH: at most CUBE_CONFIG_TEXT_MAX */
    /* What applies when the key is set nowhere, for people ("cc", "one per
     * core"); the code that reads the key implements it. */
    const char *default_text;
    const char *doc; /* one line */
} cube_config_key;

typedef enum cube_config_origin {
    CUBE_CONFIG_UNSET,       /* set nowhere: the default applies */
    CUBE_CONFIG_ENVIRONMENT, /* the variable */
    CUBE_CONFIG_FILE         /* the configuration file */
} cube_config_origin;

/* A key's value and where it came from. */
typedef struct cube_config_value {
    const cube_config_key *key;
    const char *owner; /* "core", or the name of the backend */
    cube_config_origin origin;
    /* TEXT, PATH: the value (NULL when unset). It stays valid until the
     * environment changes. */
    const char *text;
    uint32_t number;  /* UINT: the number; WORD: the word's value */
    const char *file; /* CUBE_CONFIG_FILE: the file's path */
    /* The variable's value when it was set but not usable (and was
     * therefore skipped), else NULL. */
    const char *rejected;
    char variable[64]; /* "CUBERT_<NAME>" */
} cube_config_value;

/* Looks key `name` up (case ignored): the variable when it is set and
 * usable, else the configuration file's line, else unset. A variable the
 * key does not accept is logged as a warning ("config" category) and
 * skipped. Returns 0, or -1 when there is no such key (*out is cleared). */
CUBE_API int cube_config_lookup(const char *name, cube_config_value *out);

/* The value of TEXT or PATH key `name`, or NULL when it is unset (or is
 * not such a key). Looks it up as cube_config_lookup does. */
CUBE_API const char *cube_config_text(const char *name);

/* Key `index` of all keys (the core's, then each backend's) with its
 * value, for listings: as cube_config_lookup, but never logs (a value
 * that is not usable is in `rejected`). Returns 0, or -1 past the last
 * key. */
CUBE_API int cube_config_entry(size_t index, cube_config_value *out);

/* Where `value` came from, for messages: "CUBERT_<NAME>", "<name> in
 * <file>" or "default". Writes into buf (size bytes, cut short if need be)
 * and returns it. */
CUBE_API const char *cube_config_where(const cube_config_value *value,
                                       char *buf, size_t size);

/* The configuration file this process read, or NULL when none. */
CUBE_API const char *cube_config_file(void);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_BACKEND_CONFIG_H */
