//! The documents the engine and expression benchmarks map: recipes in the shape of a public
//! recipe API, made from deterministic pseudo-text.

/// One recipe in the shape of a public recipe API: `ingredients` ingredient/measure pairs (the
/// last few empty, as real answers have them) and an instructions text of `instruction_words`.
/// A `full` recipe also has the members that are null in most answers and longer links; list items
/// are the compact form a list endpoint returns.
pub fn recipe(
    words: &mut Words,
    n: usize,
    ingredients: usize,
    instruction_words: usize,
    full: bool,
) -> String {
    let mut fields = vec![
        format!(r#""idMeal":"{}""#, 52_700 + n),
        format!(r#""strMeal":"{}""#, words.text(3)),
        format!(r#""strCategory":"{}""#, words.text(1)),
        format!(r#""strArea":"{}""#, words.text(1)),
        format!(r#""strInstructions":"{}""#, words.sentences(instruction_words)),
        format!(r#""strTags":"{},{}""#, words.word(), words.word()),
    ];
    if full {
        fields.push(format!(r#""strMealThumb":"https://img.example.org/meals/{}.jpg""#, words.word()));
        fields.push(format!(r#""strYoutube":"https://video.example.org/watch?v={n:08}""#));
    } else {
        fields.push(format!(r#""strMealThumb":"/m/{n}.jpg""#));
    }
    let filled = ingredients - ingredients / 4;
    for i in 1..=ingredients {
        let (ingredient, measure) = if i <= filled {
            (words.text(2), format!("{} {}", i * 25, words.word()))
        } else {
            (String::new(), " ".to_owned())
        };
        fields.push(format!(r#""strIngredient{i}":"{ingredient}""#));
        fields.push(format!(r#""strMeasure{i}":"{measure}""#));
    }
    if full {
        fields.push(format!(r#""strSource":"https://recipes.example.org/{n}/{}""#, words.word()));
        for name in ["strDrinkAlternate", "strImageSource", "strCreativeCommonsConfirmed", "dateModified"] {
            fields.push(format!(r#""{name}":null"#));
        }
    }
    format!("{{{}}}", fields.join(","))
}

/// Deterministic pseudo-text.
pub struct Words(pub u64);

impl Words {
    const VOCABULARY: [&'static str; 16] = [
        "lentil", "onion", "carrot", "cumin", "garlic", "simmer", "stir", "chopped", "olive", "oil",
        "tomato", "pepper", "salt", "minutes", "heat", "serve",
    ];

    pub fn word(&mut self) -> &'static str {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        Self::VOCABULARY[(self.0 >> 60) as usize]
    }

    pub fn text(&mut self, n: usize) -> String {
        (0..n).map(|_| self.word()).collect::<Vec<_>>().join(" ")
    }

    /// Words in sentences separated by `\r\n`, as recipe instructions come.
    pub fn sentences(&mut self, n: usize) -> String {
        (0..n)
            .map(|i| if i % 12 == 11 { format!("{}.\\r\\n", self.word()) } else { self.word().to_owned() })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Lowercase filler text of `n` words, as the load benchmark writes it.
fn filler(n: usize) -> String {
    (0..n).map(|i| format!("word{}", i % 17)).collect::<Vec<_>>().join(" ")
}

/// The load benchmark's recipe answer (`benches/load/run.sh` writes the same text): one recipe
/// whose long instructions and most fields the mapping does not read.
pub fn load_recipe() -> String {
    let mut text = String::from(
        r#"{"meals":[{"idMeal":"52772","strMeal":"Teriyaki Chicken Casserole","strCategory":"Chicken","strArea":"Japanese","#,
    );
    text.push_str(&format!(r#""strInstructions":"{}","#, filler(220)));
    text.push_str(r#""strMealThumb":"https://img.example/meal/52772.jpg","strTags":"Meat,Casserole","strYoutube":"https://video.example/4aZr5hZXP_s","#);
    for i in 1..=20 {
        text.push_str(&format!(r#""strIngredient{i}":"ingredient number {i}","#));
    }
    for i in 1..=20 {
        text.push_str(&format!(r#""strMeasure{i}":"{i}/4 cup","#));
    }
    text.push_str(r#""strSource":null,"dateModified":null}]}"#);
    text
}

/// The load benchmark's list answer (`benches/load/run.sh` writes the same text): 300 items, of
/// which the mapping reads five fields and skips the tags, the owner's date and the description.
pub fn load_list() -> String {
    let items: Vec<String> = (1..=300)
        .map(|i| {
            format!(
                r#"{{"id":"{i}","title":"Item number {i}","price":"{}.25","currency":"EUR","tags":["t{}","t{}"],"owner":{{"name":"Owner {}","email":"owner{}@mail.example","since":"2020-01-{:02}"}},"description":"{}"}}"#,
                i % 90 + 1,
                i % 7,
                i % 11,
                i % 50,
                i % 50,
                i % 28 + 1,
                filler(22)
            )
        })
        .collect();
    format!(r#"{{"total":300,"items":[{}]}}"#, items.join(","))
}
