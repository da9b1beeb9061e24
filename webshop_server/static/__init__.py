"""Static files of the shop pages (stylesheet and script); package data, no code."""
