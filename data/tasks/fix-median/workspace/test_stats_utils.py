import unittest

from stats_utils import mean, median


class MedianTest(unittest.TestCase):
    def test_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)

    def test_unsorted_even(self):
        self.assertEqual(median([10, 2, 8, 4]), 6)

    def test_empty(self):
        with self.assertRaises(ValueError):
            median([])

    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)


if __name__ == "__main__":
    unittest.main()
