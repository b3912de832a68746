//! The demo provider's drafts: a plausible plan made on this machine, for free, from the facts
//! it is given (never from the photos' file names), in English or Chinese — so the flow from
//! photos to a confirmed set can be tried without an account. Its answer is the same JSON a
//! model sends, and is validated like one.

use crate::domain::draft::{Answer, Bullet, Copy, DraftBody, DraftInput, Fact, Question, Shot, Usage};

/// Words of the demo's plan in one language.
struct Words {
    main: &'static str,
    main_prompt: &'static str,
    point: &'static str,
    point_prompt: &'static str,
    scene: &'static str,
    scene_prompt: &'static str,
    size_q: &'static str,
    size_opts: [&'static str; 3],
    who_q: &'static str,
    who_opts: [&'static str; 3],
}

const EN: Words = Words {
    main: "The first image shoppers see: the product alone on white",
    main_prompt: "Studio photo of {p}, centred on a pure white background, soft even light, the whole product visible",
    point: "Shows one selling point up close",
    point_prompt: "Close-up photo of {p} showing its {k}: {v}; clean background, sharp detail",
    scene: "The product in use, so shoppers picture it at home",
    scene_prompt: "Lifestyle photo of {p} in use on a tidy table at home, natural daylight",
    size_q: "How large is it?",
    size_opts: ["small", "medium", "large"],
    who_q: "Who is it for?",
    who_opts: ["for home use", "as a gift", "for an office"],
};

const ZH: Words = Words {
    main: "买家看到的第一张图：白底产品主图",
    main_prompt: "{p}的棚拍照片，纯白背景居中，柔和均匀的光线，完整展示产品",
    point: "特写展示一个卖点",
    point_prompt: "{p}的特写照片，突出{k}：{v}；干净背景，细节清晰",
    scene: "产品使用场景，让买家想象在家中使用",
    scene_prompt: "{p}在家中整洁桌面上使用的生活场景照片，自然光",
    size_q: "产品尺寸是多少？",
    size_opts: ["小号", "中号", "大号"],
    who_q: "主要适合谁？",
    who_opts: ["家用", "送礼", "办公"],
};

fn fill(t: &str, p: &str, k: &str, v: &str) -> String {
    t.replace("{p}", p).replace("{k}", k).replace("{v}", v)
}

/// The demo's plan for `input`.
pub fn plan(input: &DraftInput) -> DraftBody {
    let zh = input.language == "zh-CN";
    let w = if zh { &ZH } else { &EN };
    let p = input.product.trim();
    let profile = crate::domain::draft::main_profile(input.marketplace.as_deref()).to_string();
    let mut facts: Vec<Fact> = input
        .facts
        .iter()
        .map(|(k, v)| Fact { key: k.clone(), value: v.clone(), source: "owner".into(), confirmed: true })
        .collect();
    facts.push(Fact {
        key: "category".into(),
        value: p.chars().take(60).collect(),
        source: "inferred".into(),
        confirmed: false,
    });
    let mut shots = vec![Shot {
        role: "main".into(),
        purpose: w.main.into(),
        selling_point: String::new(),
        prompt: fill(w.main_prompt, p, "", ""),
        candidates: 2,
        profile: profile.clone(),
        source: None,
        overlay: None,
    }];
    for (k, v) in input.facts.iter().filter(|(k, _)| k != "price").take(2) {
        shots.push(Shot {
            role: "selling_point".into(),
            purpose: w.point.into(),
            selling_point: format!("{k}: {v}"),
            prompt: fill(w.point_prompt, p, k, v),
            candidates: 1,
            profile: profile.clone(),
            source: None,
            overlay: None,
        });
    }
    shots.push(Shot {
        role: "scene".into(),
        purpose: w.scene.into(),
        selling_point: String::new(),
        prompt: fill(w.scene_prompt, p, "", ""),
        candidates: 1,
        profile,
        source: None,
        overlay: None,
    });
    let keys: Vec<String> = input.facts.iter().map(|(k, _)| k.clone()).collect();
    let title = match input.facts.first() {
        Some((_, v)) if zh => format!("{v}{p}"),
        Some((_, v)) => format!("{p} — {v}"),
        None => p.to_string(),
    };
    let bullets = input
        .facts
        .iter()
        .take(5)
        .map(|(k, v)| Bullet {
            text: if zh { format!("{k}：{v}") } else { format!("{k}: {v}") },
            facts: vec![k.clone()],
        })
        .collect();
    let mut questions = Vec::new();
    let answered = |id: &str| input.answers.iter().any(|(q, _)| q == id) || keys.iter().any(|k| k == id);
    if !answered("size") {
        questions.push(Question {
            id: "size".into(),
            question: w.size_q.into(),
            options: w.size_opts.iter().map(|s| s.to_string()).collect(),
            answer: None,
        });
    }
    if !answered("audience") {
        questions.push(Question {
            id: "audience".into(),
            question: w.who_q.into(),
            options: w.who_opts.iter().map(|s| s.to_string()).collect(),
            answer: None,
        });
    }
    for (q, a) in &input.answers {
        if facts.len() < crate::domain::draft::MAX_FACTS && !facts.iter().any(|f| f.key == *q) {
            facts.push(Fact { key: q.clone(), value: a.clone(), source: "owner".into(), confirmed: true });
        }
    }
    DraftBody {
        facts,
        shots,
        copy: Copy {
            language: input.language.clone(),
            title: title.chars().take(crate::domain::draft::SHORT).collect(),
            title_facts: keys.into_iter().take(1).collect(),
            bullets,
        },
        questions,
    }
}

/// The demo's answer to a drafting call, as an adapter hands it to the worker (no tokens:
/// nothing is billed).
pub fn answer(input: &DraftInput) -> Answer {
    Answer { text: serde_json::to_string(&plan(input)).unwrap_or_default(), usage: Usage::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::draft::parse_answer;

    #[test]
    fn the_demo_plan_is_a_valid_draft_in_both_languages() {
        for (lang, product) in [("en", "blue cup"), ("zh-CN", "青花瓷茶杯")] {
            let input = DraftInput {
                product: product.into(),
                facts: vec![("material".into(), "porcelain".into())],
                marketplace: Some("taobao".into()),
                language: lang.into(),
                answers: vec![],
            };
            let b = parse_answer(&answer(&input).text, lang).expect("valid");
            assert!(b.shots.len() >= 3);
            assert!(b.copy.title.contains(product));
            assert_eq!(b.questions.len(), 2);
        }
    }
}
