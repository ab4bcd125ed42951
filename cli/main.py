def main() -> None:
    print("rhino")
