"""Text helpers."""


def slugify(text):
    """Lower-case URL slug: letters and digits joined by single dashes."""
    out = []
    for ch in text.lower():
        out.append(ch if ch.isalnum() else "-")
    return "".join(out)


def title_case(text):
    """Capitalize every word."""
    return " ".join(word.capitalize() for word in text.split())
