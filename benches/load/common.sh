# Helpers the load scripts share (sourced, after scripts/lib.sh): the recipe and list documents,
# the rules that map them, and the CPU and latency arithmetic of a measurement.

filler() { # $1 words of lowercase filler text
    local i out=""
    for ((i = 0; i < $1; i++)); do out+="word$((i % 17)) "; done
    printf '%s' "${out% }"
}

write_recipe() { # the recipe document (about 3 KB, one meal) on standard output
    {
        printf '{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken Casserole","strCategory":"Chicken","strArea":"Japanese",'
        printf '"strInstructions":"%s",' "$(filler 220)"
        printf '"strMealThumb":"https://img.example/meal/52772.jpg","strTags":"Meat,Casserole","strYoutube":"https://video.example/4aZr5hZXP_s",'
        for i in $(seq 1 20); do printf '"strIngredient%d":"ingredient number %d",' "$i" "$i"; done
        for i in $(seq 1 20); do printf '"strMeasure%d":"%d/4 cup",' "$i" "$i"; done
        printf '"strSource":null,"dateModified":null}]}'
    }
}

write_list() { # the list document (about 97 KB, 300 items) on standard output
    printf '{"total":300,"items":['
    for i in $(seq 1 300); do
        [ "$i" -gt 1 ] && printf ','
        printf '{"id":"%d","title":"Item number %d","price":"%d.25","currency":"EUR","tags":["t%d","t%d"],' "$i" "$i" "$((i % 90 + 1))" "$((i % 7))" "$((i % 11))"
        printf '"owner":{"name":"Owner %d","email":"owner%d@mail.example","since":"2020-01-%02d"},' "$((i % 50))" "$((i % 50))" "$((i % 28 + 1))"
        printf '"description":"%s"}' "$(filler 22)"
    done
    printf ']}'
}

# The rules both load scripts map the two documents with (and njs mirrors in run.sh).
INGREDIENTS='"strMeasure1, strIngredient1","strMeasure2, strIngredient2","strMeasure3, strIngredient3","strMeasure4, strIngredient4","strMeasure5, strIngredient5","strMeasure6, strIngredient6","strMeasure7, strIngredient7"'
RECIPE_RULES='{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"category":{"key":"category","type":"String"},"area":{"key":"area","type":"String"},"ingredients":{"key":"ingredients","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"name":{"keys":["strMeal"],"parents":["meals"]},"category":{"keys":["strCategory"],"parents":["meals"]},"area":{"keys":["strArea"],"parents":["meals"]},"ingredients":{"keys":['"$INGREDIENTS"'],"parents":["meals"]}}}'
LIST_RULES='{"each":["items"],"newBodyFields":{"id":{"key":"id","type":"Int"},"title":{"key":"title","type":"String"},"price":{"key":"price","type":"Double"},"owner":{"key":"owner","type":"String"},"email":{"key":"email","type":"String"}},"oldBodyFields":{"id":{"keys":["id"]},"title":{"keys":["title"]},"price":{"keys":["price"]},"owner":{"keys":["name"],"parents":["owner"]},"email":{"keys":["email"],"parents":["owner"]}}}'
# An expression over the list that reads one of its two top-level members (`total`), which a call
# reads without the other (the 300 items); instructions.sh's third count.
EXPR_RULES='{"newBodyFields":{"total":{"key":"total","type":"String"}},"oldBodyFields":{"total":{"expr":"join(\u0027 \u0027, [to_string(total), \u0027items\u0027])"}}}'

# The three-source composition of compose.sh and instructions.sh: `a` and `b` in parallel, `c`
# chained on `a` (its path holds `a`'s `idMeal`), each the recipe document; and the single route
# that maps the same fields of it.
COMPOSED_RULES='{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"area":{"key":"area","type":"String"},"category":{"key":"category","type":"String"}},"oldBodyFields":{"id":{"expr":"a.meals[0].idMeal"},"name":{"expr":"a.meals[0].strMeal"},"area":{"expr":"b.meals[0].strArea"},"category":{"expr":"c.meals[0].strCategory"}}}'
COMPOSED_SINGLE_RULES='{"newBodyFields":{"id":{"key":"id","type":"Int"},"name":{"key":"name","type":"String"},"area":{"key":"area","type":"String"},"category":{"key":"category","type":"String"}},"oldBodyFields":{"id":{"keys":["idMeal"],"parents":["meals"]},"name":{"keys":["strMeal"],"parents":["meals"]},"area":{"keys":["strArea"],"parents":["meals"]},"category":{"keys":["strCategory"],"parents":["meals"]}}}'
composition() { # $1 route path, $2 upstream base URL, $3 the `d` query value: the registration body
    local q="?d=$3"
    printf '%s' '{"path":"'"$1"'","sources":{"a":{"originalApi":{"baseUrl":"'"$2"'"},"path":"a'"$q"'"},"b":{"originalApi":{"baseUrl":"'"$2"'"},"path":"b'"$q"'"},"c":{"originalApi":{"baseUrl":"'"$2"'"},"path":"c/{{a.meals[0].idMeal}}","queries":{"d":"'"$3"'"},"after":["a"]}},"rulesAsString":'"$COMPOSED_RULES"'}'
}

to_ms() { # wrk latency text (e.g. 512.00us, 1.20ms, 2.00s) to milliseconds
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}

# The figures of what `wrk --latency` printed ($1): "requests/s p50_ms p99_ms errors requests";
# errors are the answers that were not 2xx or 3xx and the socket errors of every kind.
wrk_figures() {
    local rps p50 p99 errors requests
    rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$1")
    p50=$(to_ms "$(awk '$1 == "50%" { print $2 }' <<<"$1")")
    p99=$(to_ms "$(awk '$1 == "99%" { print $2 }' <<<"$1")")
    errors=$(awk '/Non-2xx or 3xx responses:/ { s += $NF }
        /Socket errors:/ { gsub(/[^0-9 ]/, " "); for (i = 1; i <= NF; i++) s += $i } END { print s + 0 }' <<<"$1")
    requests=$(awk '/ requests in / { print $1 }' <<<"$1")
    echo "$rps $p50 $p99 $errors $requests"
}

cpu_ticks() { # "pid user system;" per process: clock ticks so far, all its threads; a process that has gone is left out
    local pid stat
    for pid in "$@"; do
        for stat in /proc/"$pid"/task/*/stat; do
            cat "$stat" 2>/dev/null || true
        done | awk -v pid="$pid" '{ sub(/.*\) /, ""); u += $12; s += $13; n++ } END { if (n) printf "%s %d %d;", pid, u, s }'
    done
}

b64url() { basenc --base64url | tr -d '=\n'; }

write_signing_key() { # $1 directory: an RSA key ($1/jwt.pem) and its key set ($1/keys.json, kid "load")
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1/jwt.pem" 2>/dev/null
    local n
    n=$(openssl rsa -in "$1/jwt.pem" -noout -modulus | cut -d= -f2 | basenc --base16 -d | b64url)
    printf '{"keys":[{"kty":"RSA","kid":"load","alg":"RS256","use":"sig","n":"%s","e":"AQAB"}]}' "$n" >"$1/keys.json"
}

sign_token() { # $1 key file, $2 claims (JSON): an RS256 token signed with kid "load"
    local head body sig
    head=$(printf '{"alg":"RS256","kid":"load","typ":"JWT"}' | b64url)
    body=$(printf '%s' "$2" | b64url)
    sig=$(printf '%s.%s' "$head" "$body" | openssl dgst -sha256 -sign "$1" -binary | b64url)
    printf '%s.%s.%s' "$head" "$body" "$sig"
}

# The issuer of the load scripts' tokens, and a route's `callers` taking them ($1: the key set's URL).
LOAD_ISSUER=https://id.load.test/
jwt_callers() { printf '{"jwt":[{"issuer":"%s","audiences":["load"],"jwksUri":"%s","algorithms":["RS256"]}]}' "$LOAD_ISSUER" "$1"; }

release_build() { # builds recast for release (through ccache) and sets RECAST to it
    use_ccache
    announce_rocksdb release
    cargo build --release --locked --bin recast
    RECAST="$CARGO_TARGET_DIR/release/recast"
}

write_server_certificate() { # $1 directory: a CA (ca.pem, ca.key) and a certificate it signs for 127.0.0.1 (server.pem, server.key)
    (
        cd "$1"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -keyout ca.key -out ca.pem \
            -subj /CN=load-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout server.key -out server.csr -subj /CN=server 2>/dev/null
        printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nsubjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out server.pem -extfile server.ext 2>/dev/null
        chmod 644 server.pem server.key
    )
}
