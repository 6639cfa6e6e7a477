# Helpers the load scripts share (sourced, after scripts/lib.sh): the recipe document and the
# CPU and latency arithmetic of a measurement.

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

to_ms() { # wrk latency text (e.g. 512.00us, 1.20ms, 2.00s) to milliseconds
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}

cpu_ticks() { # "pid user system;" per process: clock ticks so far, all its threads; a process that has gone is left out
    local pid stat
    for pid in "$@"; do
        for stat in /proc/"$pid"/task/*/stat; do
            cat "$stat" 2>/dev/null || true
        done | awk -v pid="$pid" '{ sub(/.*\) /, ""); u += $12; s += $13; n++ } END { if (n) printf "%s %d %d;", pid, u, s }'
    done
}
