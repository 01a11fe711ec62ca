"""The status page's charts: the one chart module, ``specmeter.streams.chart`` (issue 45),
under the name the page and its tests import."""

from ..chart import HEIGHT, WIDTH, Mark, bar_chart, number, point_chart, text_width

__all__ = ["Mark", "bar_chart", "point_chart", "number", "text_width", "WIDTH", "HEIGHT"]
