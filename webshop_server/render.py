"""Page models (:meth:`webshop_server.shop.Shop.page`) as HTML, as the original's ``text`` observation (visible
texts joined by `` [SEP] ``) and as ``text_rich`` (buttons marked ``[button] ... [button_]``, chosen options
``[clicked button] ... [clicked button_]``).

Every string that comes from a request or the catalog is HTML-escaped (``html.escape`` with quotes), so a query
like ``<script>`` shows as text. Pages load one same-origin script and stylesheet; the Content-Security-Policy the
server sends forbids inline scripts.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any
from urllib.parse import quote

from webshop_server.shop import BACK_TO_SEARCH, END_BUTTON, NEXT_PAGE, OPTION_PREFIX, PREV_PAGE, PageState

SEP = " [SEP] "


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


# ============================================================================================ text
def _review_texts(reviews: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in reviews:
        out += [f'"{r.get("title", "")}"', str(r.get("score", "")), str(r.get("body", ""))]
    return out


def render_text(model: dict[str, Any]) -> str:
    """The original's simple text mode."""
    kind = model["page"]
    if kind == "search":
        return SEP.join(["WebShop", "Instruction:", model["instruction"], "Search"])
    if kind == "done":
        return SEP.join(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{model['reward']}"])
    parts = ["Instruction:", model["instruction"], BACK_TO_SEARCH]
    if kind == "results":
        parts.append(f"Page {model['page_num']} (Total results: {model['total']})")
        if model["has_prev"]:
            parts.append(PREV_PAGE)
        if model["has_next"]:
            parts.append(NEXT_PAGE)
        for p in model["products"]:
            parts += [p["asin"], p["title"], p["price"]]
        return SEP.join(parts)
    parts.append(PREV_PAGE)
    if kind == "item":
        for name, values in model["options"].items():
            parts.append(name)
            parts += values
        parts += [model["title"], f"Price: {model['price']}", f"Rating: {model['rating']}"]
        parts += model["tabs"] + [END_BUTTON]
        return SEP.join(parts)
    content = model["content"]
    if model["sub"] == "Description":
        parts.append(content or "No Description")
    elif model["sub"] == "Reviews":
        parts += _review_texts(content) or ["No reviews found"]
    else:
        parts += [str(c) for c in content]
    return SEP.join(parts)


def render_text_rich(model: dict[str, Any]) -> str:
    """The original's ``text_rich`` mode: one visible text per line, clickables marked."""

    def button(label: str) -> str:
        return f"[button] {label} [button_]"

    kind = model["page"]
    if kind == "search":
        return "\n".join(["WebShop", "Instruction:", model["instruction"], button("Search")]) + "\n"
    if kind == "done":
        return render_text(model).replace(SEP, "\n") + "\n"
    lines = ["Instruction:", model["instruction"], button(BACK_TO_SEARCH)]
    prefix = ""
    if kind == "results":
        lines.append(f"Page {model['page_num']} (Total results: {model['total']})")
        if model["has_prev"]:
            lines.append(button(PREV_PAGE))
        if model["has_next"]:
            lines.append(button(NEXT_PAGE))
        for p in model["products"]:
            lines += ["", button(p["asin"]), p["title"], p["price"]]
    else:
        lines.append(button(PREV_PAGE))
        if kind == "item":
            selected = set(model["selected"].values())
            for name, values in model["options"].items():
                lines.append(name)
                for v in values:
                    if v in selected:
                        lines.append(f"  [clicked button] {v} [clicked button_]")
                        prefix = f"You have clicked {v}.\n" + prefix
                    else:
                        lines.append(f"  {button(v)}")
            lines += [model["title"], f"Price: {model['price']}", f"Rating: {model['rating']}"]
            lines += [button(t) for t in model["tabs"]] + [button(END_BUTTON)]
        else:
            lines += render_text(model).split(SEP)[4:]
    return prefix + "\n".join(lines) + "\n"


# ============================================================================================ html
def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_e(title)}</title>\n"
        '<link rel="stylesheet" href="/static/style.css">\n'
        '<link rel="icon" href="data:,">\n'
        '<script src="/static/webshop.js" defer></script>\n'
        f'</head>\n<body>\n<div class="container">\n{body}\n</div>\n</body>\n</html>\n'
    )


def _instruction(model: dict[str, Any]) -> str:
    return f'<div id="instruction-text"><h4>Instruction:<br>{_e(model["instruction"])}</h4></div>'


def _nav(model: dict[str, Any], prev_url: str | None) -> str:
    sid = quote(model["session"], safe="")
    out = [f'<div class="nav"><a class="btn btn-success" href="/{sid}">{_e(BACK_TO_SEARCH)}</a>']
    if prev_url is not None:
        out.append(f'<a class="btn btn-primary" href="{_e(prev_url)}">{_e(PREV_PAGE)}</a>')
    out.append("</div>")
    return "".join(out)


def render_html(model: dict[str, Any]) -> str:
    kind = model["page"]
    sid = quote(model["session"], safe="")
    if kind == "search":
        body = (
            "<div id=\"logo\"><h2>WebShop</h2></div>" + _instruction(model)
            + f"<form id=\"form-search\" method=\"get\" action=\"/{sid}/search\">"
            "<input id=\"search_input\" type=\"text\" name=\"q\" placeholder=\"Search...\" maxlength=\"500\" required>"
            "<button class=\"btn btn-success\" type=\"submit\">Search</button></form>"
        )  # fmt: skip
        return _page("WebShop", body)
    if kind == "results":
        state = PageState(model["session"], "results", model["query"], model["page_num"])
        nav = [f'<a class="btn btn-success" href="/{sid}">{_e(BACK_TO_SEARCH)}</a>']
        if model["has_prev"]:
            state.page = model["page_num"] - 1
            nav.append(f'<a class="btn btn-primary" href="{_e(state.url())}">{_e(PREV_PAGE)}</a>')
        if model["has_next"]:
            state.page = model["page_num"] + 1
            nav.append(f'<a class="btn btn-primary" href="{_e(state.url())}">{_e(NEXT_PAGE)}</a>')
        first = (model["page_num"] - 1) * 10 + 1
        items = "".join(
            '<div class="grid-item">'
            f'<h4 class="product-asin"><a class="product-link" href="{_e(p["url"])}">{_e(p["asin"])}</a></h4>'
            f'<h4 class="product-title">{_e(p["title"])}</h4><h5 class="product-price">{_e(p["price"])}</h5></div>'
            for p in model["products"]
        )
        body = (
            _instruction(model) + f"<h4>Current Query: <span id=\"current-query\">{_e(model['query'])}</span></h4>"
            + f"<h1>Results</h1><p>Page {model['page_num']} (Total results: {model['total']}), "
            + f"showing {first if model['products'] else 0}-{first + len(model['products']) - 1}</p>"
            + "<div class=\"nav\">" + "".join(nav) + "</div>"
            + (f"<div class=\"grid-container\">{items}</div>" if items else "<p id=\"no-results\">No results.</p>")
        )  # fmt: skip
        return _page("WebShop results", body)
    if kind in ("item", "sub"):
        results = PageState(model["session"], "results", model["query"], model["page_num"]).url()
        item = PageState(
            model["session"], "item", model["query"], model["page_num"], model["asin"], "", model["selected"]
        )
        if kind == "sub":
            return _page("WebShop " + model["sub"], _instruction(model) + _nav(model, item.url()) + _sub_body(model))
        buy = PageState(model["session"], "done", "", 1, model["asin"])
        groups = []
        for name, values in model["options"].items():
            radios = []
            for k, v in enumerate(values):
                choice = dict(model["selected"], **{name: v})
                url = PageState(model["session"], "item", model["query"], model["page_num"], model["asin"], "", choice)
                checked = " checked" if model["selected"].get(name) == v else ""
                rid = f"radio_{_e(name)}{k}"
                radios.append(
                    f'<input type="radio" id="{rid}" name="{_e(OPTION_PREFIX + name)}" value="{_e(v)}" '
                    f'form="buy-form" data-url="{_e(url.url())}"{checked}><label for="{rid}">{_e(v)}</label>'
                )
            groups.append(
                f'<div class="option"><h4>{_e(name)}</h4><div class="radio-toolbar">{"".join(radios)}</div></div>'
            )
        tabs = "".join(
            f'<a class="btn btn-primary" href="{_e(PageState(model["session"], "sub", model["query"], model["page_num"], model["asin"], t, model["selected"]).url())}">{_e(t)}</a>'
            for t in model["tabs"]
        )
        body = (
            _instruction(model) + _nav(model, results)
            + "<div class=\"row\"><div class=\"options\">" + "".join(groups) + "</div>"
            + f"<div class=\"details\"><h2 id=\"product-title\">{_e(model['title'])}</h2>"
            + f"<h4 id=\"product-price\">Price: {_e(model['price'])}</h4><h4>Rating: {_e(model['rating'])}</h4>"
            + f"<div class=\"tabs\">{tabs}</div></div>"
            + f"<form id=\"buy-form\" method=\"get\" action=\"{_e(buy.url())}\">"
            + "<button id=\"buy-now\" class=\"btn btn-lg purchase\" type=\"submit\">Buy Now</button></form></div>"
        )  # fmt: skip
        return _page("WebShop item", body)
    # done
    info = model["reward_info"]
    rows = "".join(
        f'<tr><th>{_e(k)}</th><td id="part-{_e(k)}">{_e(round(v, 4) if isinstance(v, float) else v)}</td></tr>'
        for k, v in info.items()
    )
    body = (
        "<div id=\"thankyou\"><h1>Thank you for shopping with us!</h1></div>"
        + f"<h3>Your score (min 0.0, max 1.0)</h3><pre id=\"reward\">{model['reward']}</pre>"
        + f"<h3>Reward parts</h3><table id=\"reward-parts\">{rows}</table>"
        + f"<h3>Purchased</h3><p id=\"asin\">{_e(model['asin'])}: {_e(model['title'])} at ${model['price']}</p>"
        + f"<pre id=\"options\">{_e(json.dumps(model['options'], ensure_ascii=False))}</pre>"
        + f"<details><summary>Target</summary><pre id=\"goal\">{_e(json.dumps(model['goal'], indent=1, ensure_ascii=False))}</pre></details>"
        + f"<p><a class=\"btn btn-success\" href=\"/{sid}\">New search</a></p>"
    )  # fmt: skip
    return _page("WebShop purchase", body)


def _sub_body(model: dict[str, Any]) -> str:
    content = model["content"]
    sub = model["sub"]
    if sub == "Description":
        inner = f'<p class="product-info">{_e(content) if content else "No Description"}</p>'
    elif sub == "Features":
        inner = "<ul>" + "".join(f'<li><p class="product-info">{_e(c)}</p></li>' for c in content) + "</ul>"
    elif sub == "Reviews":
        if not content:
            inner = "<h4>No reviews found</h4>"
        else:
            inner = "".join(
                f'<div class="card"><h4 class="review-title">"{_e(r.get("title", ""))}"</h4>'
                f'<p><span>{_e(r.get("score", ""))}</span></p><p class="content">{_e(r.get("body", ""))}</p></div>'
                for r in content
            )
    else:
        inner = "<ul>" + "".join(f'<li><p class="product-info">{_e(c)}</p></li>' for c in content) + "</ul>"
    return f'<div class="card card-body" name="{_e(sub.lower())}">{inner}</div>'


def render(model: dict[str, Any], mode: str) -> str:
    if mode == "text":
        return render_text(model)
    if mode == "text_rich":
        return render_text_rich(model)
    if mode == "html":
        return render_html(model)
    if mode == "url":
        return model["url"]
    raise ValueError(f"invalid observation mode {mode!r}: expected 'text', 'text_rich', 'html' or 'url'")


OBSERVATION_MODES = ("text", "text_rich", "html", "url")
