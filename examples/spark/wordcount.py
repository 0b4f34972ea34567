"""PySpark word count: `wordcount.py INPUT OUTPUT` writes `word<TAB>count` lines."""

import sys

from pyspark.sql import SparkSession


def main(source: str, target: str) -> None:
    spark = SparkSession.builder.appName("pingo-wordcount").getOrCreate()
    lines = spark.sparkContext.textFile(source)
    counts = (
        lines.flatMap(lambda line: line.split())
        .map(lambda word: (word.lower(), 1))
        .reduceByKey(lambda a, b: a + b)
        .sortByKey()
    )
    counts.map(lambda kv: f"{kv[0]}\t{kv[1]}").saveAsTextFile(target)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
