import unittest

from textkit import slugify, title_case


class SlugifyTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(slugify("Hello"), "hello")

    def test_collapses_separators(self):
        self.assertEqual(slugify("  Hello,   World!  "), "hello-world")

    def test_digits(self):
        self.assertEqual(slugify("Release 2.0 notes"), "release-2-0-notes")

    def test_title_case(self):
        self.assertEqual(title_case("hello world"), "Hello World")


if __name__ == "__main__":
    unittest.main()
